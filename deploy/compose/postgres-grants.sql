-- gap-healer on the Eventuous PostgreSQL store in schema eventuous.
-- Run as the schema owner. The grantee is the healer login's role
-- (`gap-healer sql --role NAME`; <healer_role>, to be replaced, without it).
--
-- The healer reads positions, checkpoints and the identity's sequence, and
-- writes only tombstone rows
-- (INSERT on messages, with OVERRIDING SYSTEM VALUE, which needs no right
-- beyond INSERT) and the tombstone stream's row in streams (INSERT once,
-- then UPDATE of its version). It creates no objects.

GRANT USAGE ON SCHEMA eventuous TO gap_healer;
GRANT SELECT, INSERT ON eventuous.messages TO gap_healer;
GRANT SELECT, INSERT (stream_name, version), UPDATE (version) ON eventuous.streams TO gap_healer;
GRANT SELECT ON eventuous.checkpoints TO gap_healer;

-- The identity's sequence, read (never drawn from) by the transaction-end
-- proof: how far it has handed positions out. Its name is what
-- pg_get_serial_sequence('eventuous.messages', 'global_position') gives
-- (`gap-healer check` names it when it differs).
GRANT SELECT ON SEQUENCE eventuous.messages_global_position_seq TO gap_healer;
