-- The published videos whose title or description match the query ($1, web search syntax:
-- words, "quoted phrases", OR, -excluded), best first (a title match weighs more), at most $2.
SELECT d.video_id, d.title, d.version, ts_rank(d.document, q) AS rank
FROM search_documents d, websearch_to_tsquery('english', $1) q
WHERE d.status = 'published' AND d.document @@ q
ORDER BY rank DESC, d.video_id
LIMIT $2
