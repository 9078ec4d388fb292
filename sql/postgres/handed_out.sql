-- The first half of a reading of open transactions (transactions.sql is the
-- second, sent only after this one has answered): how far a store's
-- sequence had handed positions out. One of these per store that may read
-- its sequence (__n__ its number in the reading, __sequence__ its name as
-- identity_sequence.sql gave it), joined with UNION ALL into one statement.
-- Read from the sequence relation itself, which takes only AccessShareLock:
-- pg_sequence_last_value() and pg_sequences take RowExclusiveLock on the
-- sequence, the very lock the reading looks for, and would show the
-- healer's own sessions as writers. last_value is the next value to hand
-- out until the sequence's first nextval (is_called false).
SELECT
    __n__ AS n,
    CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END AS h
FROM __sequence__ AS s
