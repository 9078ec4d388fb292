-- The highest and the lowest committed positions, NULL for an empty table
-- (each read from one end of the primary key index). The lowest is where a
-- store whose identity was restarted before its first append begins (ALTER
-- ... RESTART does not change the sequence's start): the healer does not
-- start below it unless told to.
SELECT
    MAX(__position__)::bigint AS head,
    MIN(__position__)::bigint AS first
FROM __table__;
