-- `gap-healer check`, and the shape `run`, `scan` and `heal` refuse to work
-- without: the identity sequence that hands out the positions. Every
-- position must be drawn by the inserting statement itself, one at a time:
-- a CACHE above 1 lets each session pre-allocate values, so a "hole" can
-- be a number another session will still insert; an increment other than 1
-- or another table drawing from the same sequence breaks the order the
-- safety argument rests on. Its last value (read afterwards from the
-- sequence relation, with handed_out.sql, where the login has SELECT on it:
-- pg_sequence_last_value() would take the RowExclusiveLock the
-- transaction-end proof looks for) below the table's highest position means
-- rows were written above what the identity has handed out: the positions
-- in between will still be handed out. $1 is the table's qualified name,
-- $2 its position column.
WITH seq AS (
    SELECT PG_GET_SERIAL_SEQUENCE($1::text, $2::text)::regclass AS oid
)

SELECT
    q.oid::regclass::text AS name,
    s.seqstart AS start,
    s.seqincrement AS increment,
    s.seqcache AS cache,
    HAS_SEQUENCE_PRIVILEGE(q.oid, 'SELECT') AS readable,
    ARRAY(
        SELECT DISTINCT (d.refobjid::regclass)::text
        FROM pg_depend AS d
        WHERE
            d.objid = q.oid
            AND d.classid = 'pg_class'::regclass
            AND d.refclassid = 'pg_class'::regclass
            AND d.refobjid <> TO_REGCLASS($1::text)
            AND d.deptype IN ('a', 'i')
        UNION
        SELECT DISTINCT (a.adrelid::regclass)::text
        FROM pg_depend AS d
        INNER JOIN pg_attrdef AS a ON d.objid = a.oid
        WHERE
            d.refobjid = q.oid
            AND d.classid = 'pg_attrdef'::regclass
            AND a.adrelid <> TO_REGCLASS($1::text)
    ) AS other_tables
FROM seq AS q
INNER JOIN pg_sequence AS s ON q.oid = s.seqrelid;
