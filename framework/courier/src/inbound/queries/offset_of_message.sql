-- The publish time saved with message $2 in one of group $1's lanes.
WITH RECURSIVE positions AS ({positions})
SELECT max(publish_time) FROM positions WHERE message_id = $2
