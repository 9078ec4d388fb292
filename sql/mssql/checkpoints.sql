-- gap-healer, SQL Server: the subscriptions' checkpoints (Engine::checkpoints).
-- No result set at all when the table does not exist: subscriptions may keep
-- their checkpoints elsewhere.

-- Session option: a checkpoint row being written is waited for (a skipped
-- row could hide the lowest checkpoint), but not for ever.
SET LOCK_TIMEOUT 5000;

IF OBJECT_ID(N'__schema__.[Checkpoints]', N'U') IS NOT NULL
    SELECT
        c.Id AS id,
        c.Position AS position
    FROM __schema__.[Checkpoints] AS c;
