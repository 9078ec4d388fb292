-- gap-healer on the Eventuous PostgreSQL store in schema eventuous.
-- Run as the schema owner. The grantee is the healer login's role
-- (`gap-healer sql --role NAME`; <healer_role>, to be replaced, without it).
--
-- The healer reads positions and checkpoints, and writes only tombstone rows
-- (INSERT on messages, with OVERRIDING SYSTEM VALUE, which needs no right
-- beyond INSERT) and the tombstone stream's row in streams (INSERT once,
-- then UPDATE of its version). It creates no objects.

GRANT USAGE ON SCHEMA eventuous TO gap_healer;
GRANT SELECT, INSERT ON eventuous.messages TO gap_healer;
GRANT SELECT, INSERT (stream_name, version), UPDATE (version) ON eventuous.streams TO gap_healer;
GRANT SELECT ON eventuous.checkpoints TO gap_healer;
