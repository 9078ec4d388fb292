-- The contiguous watermark gap-healer published for store @P1: every
-- position at or below it is a committed event or a tombstone. No row: none
-- published yet.
SELECT CAST(position AS BIGINT) AS position
FROM __watermark__
WHERE store = @P1;
