-- The roll of gap-healer replicas in this database and the leader locks
-- held, in one look at pg_locks (readable by every login), shared by every
-- store's election of the database: the replicas are the two-key advisory
-- locks of the roll's class $1 (roll_join.sql), the leader locks the
-- bigint advisory locks (leader_lock.sql), each as its key. Advisory locks
-- belong to one database; pg_locks shows every database's.
SELECT
    ARRAY(
        SELECT l.objid::bigint
        FROM pg_locks AS l
        WHERE
            l.locktype = 'advisory'
            AND l.granted
            AND l.objsubid = 2
            AND l.classid = $1::int::oid
            AND l.database = d.oid
    ) AS replicas,
    ARRAY(
        SELECT (l.classid::bigint << 32) | l.objid::bigint
        FROM pg_locks AS l
        WHERE
            l.locktype = 'advisory'
            AND l.granted
            AND l.objsubid = 1
            AND l.database = d.oid
    ) AS held
FROM pg_database AS d
WHERE d.datname = CURRENT_DATABASE();
