-- What holds back this database's xmin horizon (vacuum keeps every dead row version an open
-- snapshot may still see), one row:
--   * the session with the oldest snapshot, by xid age and then by start (sessions of this
--     database, and walsenders, which hold every database);
--   * the replication slot holding the oldest xmin or catalog_xmin (a slot holds every
--     database; no timestamp exists for it, only its xid age);
--   * the oldest prepared transaction of this database;
--   * the dead and live row versions of {schema}.outbox and its last autovacuum.
-- Everyone sees every session's backend_xmin, but another role's xact_start, backend_start
-- and state only superusers and members of pg_read_all_stats (pg_monitor) see: for such a
-- session session_age_secs and session_state are NULL, and sees_all_sessions says why.
WITH session AS (
    SELECT a.pid,
           a.state,
           a.application_name,
           a.datname,
           a.usename,
           age(a.backend_xmin) AS xid_age,
           CASE WHEN coalesce(a.xact_start, a.backend_start) IS NOT NULL THEN
               greatest(extract(epoch FROM now() - coalesce(a.xact_start, a.backend_start)), 0)::float8
           END AS age_secs
    FROM pg_stat_activity a
    WHERE a.backend_xmin IS NOT NULL
      AND a.pid <> pg_backend_pid()
      -- Autovacuum workers run as no user: vacuum's snapshot holds no horizon back.
      AND a.usesysid IS NOT NULL
      AND (a.datname = current_database() OR a.datid IS NULL)
    ORDER BY age(a.backend_xmin) DESC, coalesce(a.xact_start, a.backend_start) NULLS LAST
    LIMIT 1
), slot AS (
    SELECT slot_name,
           slot_type,
           active,
           age(xmin) AS xmin_age,
           age(catalog_xmin) AS catalog_xmin_age,
           count(*) OVER () AS holding
    FROM pg_replication_slots
    WHERE xmin IS NOT NULL OR catalog_xmin IS NOT NULL
    ORDER BY greatest(age(xmin), age(catalog_xmin)) DESC
    LIMIT 1
), prepared AS (
    SELECT gid,
           owner,
           age(transaction) AS xid_age,
           greatest(extract(epoch FROM now() - prepared), 0)::float8 AS age_secs,
           count(*) OVER () AS holding
    FROM pg_prepared_xacts
    WHERE database = current_database()
    ORDER BY prepared
    LIMIT 1
), outbox AS (
    SELECT n_dead_tup, n_live_tup, last_autovacuum
    FROM pg_stat_user_tables
    WHERE relid = '{schema}.outbox'::regclass
)
SELECT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE') AS sees_all_sessions,
       s.pid AS session_pid,
       s.state AS session_state,
       s.application_name AS session_application,
       s.datname AS session_database,
       s.usename AS session_user,
       s.xid_age AS session_xid_age,
       s.age_secs AS session_age_secs,
       sl.slot_name,
       sl.slot_type,
       sl.active AS slot_active,
       sl.xmin_age AS slot_xmin_age,
       sl.catalog_xmin_age AS slot_catalog_xmin_age,
       coalesce(sl.holding, 0) AS slots_holding,
       p.gid AS prepared_gid,
       p.owner AS prepared_owner,
       p.xid_age AS prepared_xid_age,
       p.age_secs AS prepared_age_secs,
       coalesce(p.holding, 0) AS prepared_holding,
       o.n_dead_tup AS outbox_dead_tuples,
       o.n_live_tup AS outbox_live_tuples,
       o.last_autovacuum AS outbox_last_autovacuum
FROM (SELECT) AS one
LEFT JOIN session s ON true
LEFT JOIN slot sl ON true
LEFT JOIN prepared p ON true
LEFT JOIN outbox o ON true
