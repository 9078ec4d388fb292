-- gap-healer on Babelfish only: after a fill batch that a lock timeout
-- ended (Babelfish ends the whole batch and rolls its transaction back, so
-- no result row came), on that same session: end anything left open, turn
-- IDENTITY_INSERT off for the healed table (the batch may have ended
-- between turning it on and off) and the lock timeout back to the
-- connection default (Babelfish keeps a batch's SET LOCK_TIMEOUT after the
-- batch, and the batch ended before its own reset). The session goes back to the pool when
-- this answers 0, keeping what Babelfish compiled on it (the fill batch:
-- 1.6-2.7 s the first time in a session) instead of a new login and a new
-- compilation after every held position.
--
-- The schema placeholder is replaced by the bracketed, validated schema
-- name (and [Messages] by a described table's name).

IF @@TRANCOUNT > 0
    ROLLBACK TRANSACTION;

SET IDENTITY_INSERT __schema__.[Messages] OFF;

SET LOCK_TIMEOUT -1;

SELECT @@TRANCOUNT AS open_transactions;
