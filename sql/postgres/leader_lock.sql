-- Take the leader lock without waiting, on the session opened for it alone:
-- a session-level advisory lock, released by the server when the session
-- ends. $1 is the lock's key (FNV-1a of the leader key). The backend pid is
-- the session's id, which fills check the lock against (the fence).
SELECT
    PG_TRY_ADVISORY_LOCK($1::bigint) AS taken,
    PG_BACKEND_PID() AS session_id;
