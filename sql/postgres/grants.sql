-- gap-healer on the Eventuous PostgreSQL store in schema __schema__.
-- Run as the schema owner. The grantee is the healer login's role
-- (`gap-healer sql --role NAME`; <healer_role>, to be replaced, without it).
--
-- The healer reads positions, checkpoints and the identity's sequence, and
-- writes only tombstone rows
-- (INSERT on messages, with OVERRIDING SYSTEM VALUE, which needs no right
-- beyond INSERT) and the tombstone stream's row in streams (INSERT once,
-- then UPDATE of its version). It creates no objects.

GRANT USAGE ON SCHEMA __schema__ TO __healer_role__;
GRANT SELECT, INSERT ON __schema__.messages TO __healer_role__;
GRANT SELECT, INSERT (stream_name, version), UPDATE (version) ON __schema__.streams TO __healer_role__;
GRANT SELECT ON __schema__.checkpoints TO __healer_role__;

-- The identity's sequence, read (never drawn from) by the transaction-end
-- proof: how far it has handed positions out. Its name is what
-- pg_get_serial_sequence('__schema__.messages', 'global_position') gives
-- (`gap-healer check` names it when it differs).
GRANT SELECT ON SEQUENCE __schema__.messages_global_position_seq TO __healer_role__;
