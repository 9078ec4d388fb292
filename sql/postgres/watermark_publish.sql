-- Publishes store $1's contiguous watermark $2 for the healed table $3
-- (schema.table; the row names it with the database in front). It never
-- decreases: a lower value (an older replica, a restart) leaves the row as
-- it is; and it never touches a row that describes another table (two
-- daemons whose stores share a name and a watermark table): `owner` then
-- names that table, read as the statement began, and the caller refuses.
WITH published AS (
    INSERT INTO __watermark__ AS w (store, healed_table, position, updated_at)
    VALUES ($1::text, CURRENT_DATABASE() || '.' || $3::text, $2::bigint, NOW())
    ON CONFLICT (store) DO UPDATE
        SET position = excluded.position, updated_at = excluded.updated_at
        WHERE
            w.position < excluded.position
            AND w.healed_table = excluded.healed_table
    RETURNING 1
)

SELECT
    EXISTS (SELECT 1 FROM __watermark__ WHERE store = $1::text) AS existed,
    (SELECT healed_table FROM __watermark__ WHERE store = $1::text) AS owner,
    CURRENT_DATABASE() || '.' || $3::text AS mine,
    (SELECT COUNT(*) FROM published) AS written;
