-- The contiguous watermark gap-healer published for store $1: every
-- position at or below it is a committed event or a tombstone. No row: none
-- published yet.
SELECT position::bigint AS position
FROM __watermark__
WHERE store = $1::text;
