-- Publishes store $1's contiguous watermark $2. It never decreases: a lower
-- value (an older replica, a restart) leaves the row as it is.
INSERT INTO __watermark__ AS w (store, position, updated_at)
VALUES ($1::text, $2::bigint, now())
ON CONFLICT (store) DO UPDATE
    SET position = excluded.position, updated_at = excluded.updated_at
    WHERE w.position < excluded.position;
