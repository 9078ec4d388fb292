-- Put this lock session on its database's roll of gap-healer replicas: a
-- session-level advisory lock of two int keys, the roll's class ($1) and
-- the replica's number ($2, its name's 32-bit hash as int). The server
-- releases it with the session, so the roll lists the replicas whose lock
-- session is alive. False when another live session holds that number.
SELECT PG_TRY_ADVISORY_LOCK($1::int, $2::int) AS joined;
