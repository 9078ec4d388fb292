-- The contiguous watermark gap-healer published for store $1 of the healed
-- table $2 (schema.table): every position at or below it is a committed
-- event or a tombstone. No row: none published yet. A row whose
-- healed_table is another (or none) describes another table: the caller
-- refuses it rather than start its proof there.
SELECT
    position::bigint AS position,
    healed_table AS owner,
    CURRENT_DATABASE() || '.' || $2::text AS mine
FROM __watermark__
WHERE store = $1::text;
