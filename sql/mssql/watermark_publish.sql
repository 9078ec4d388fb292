-- Publishes store @P1's contiguous watermark @P2. It never decreases: a
-- lower value (an older replica, a restart) leaves the row as it is. The
-- key-range lock (HOLDLOCK) makes two first publications of one store wait
-- for each other instead of both inserting; XACT_ABORT ends the transaction
-- on any error, so the session goes back to the pool clean.
SET XACT_ABORT ON;
BEGIN TRANSACTION;

UPDATE __watermark__ WITH (UPDLOCK, HOLDLOCK)
SET position = @P2, updated_at = SYSUTCDATETIME()
WHERE store = @P1 AND position < @P2;

IF @@ROWCOUNT = 0
    INSERT INTO __watermark__ (store, position, updated_at)
    SELECT @P1, @P2, SYSUTCDATETIME()
    WHERE NOT EXISTS (
        SELECT 1 FROM __watermark__ WITH (UPDLOCK, HOLDLOCK)
        WHERE store = @P1
    );

COMMIT TRANSACTION;
