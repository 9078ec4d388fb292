-- gap-healer on the Eventuous PostgreSQL store in schema __schema__.
-- Run as the schema owner, after replacing gap_healer with the healer's role.
--
-- The healer reads positions and checkpoints, and writes only tombstone rows
-- (INSERT on messages, with OVERRIDING SYSTEM VALUE, which needs no right
-- beyond INSERT) and the tombstone stream's row in streams (INSERT once,
-- then UPDATE of its version). It creates no objects.

GRANT USAGE ON SCHEMA __schema__ TO gap_healer;
GRANT SELECT, INSERT ON __schema__.messages TO gap_healer;
GRANT SELECT, INSERT (stream_name, version), UPDATE (version) ON __schema__.streams TO gap_healer;
GRANT SELECT ON __schema__.checkpoints TO gap_healer;
