-- gap-healer, SQL Server: the installed fill procedure as this login sees it
-- (MssqlEngine::fill_mode, and `gap-healer check`). Two result sets:
--   1. one row: whether the procedure exists (OBJECT_ID is NULL when it is
--      absent or invisible to the login), whether the login may execute
--      it (HAS_PERMS_BY_NAME is NULL for an unknown securable, 0 without the
--      right), and whether it has ALTER on Messages (direct mode);
--   2. its parameters, in order. A login with EXECUTE on the procedure sees
--      them (metadata visibility follows any permission on the object); it
--      cannot read the definition (OBJECT_DEFINITION needs VIEW DEFINITION).
--      The engine compares them with the procedure it would install: an older
--      gap-healer's procedure, which took the tombstone stream and type as
--      parameters, is not used.
SELECT
    CAST(
        CASE
            WHEN OBJECT_ID(N'__schema__.[gap_healer_fill]', N'P') IS NULL THEN 0
            ELSE 1
        END AS BIT
    ) AS procedure_exists,
    CAST(
        CASE
            WHEN
                HAS_PERMS_BY_NAME(
                    N'__schema__.[gap_healer_fill]', N'OBJECT', N'EXECUTE'
                ) = 1
                THEN 1
            ELSE 0
        END AS BIT
    ) AS procedure_execute,
    -- Whether direct mode could fill instead (SET IDENTITY_INSERT needs ALTER):
    -- a procedure that cannot run as its owner (error 15517) is then an error,
    -- not a fallback that fails again on every fill.
    CAST(
        CASE
            WHEN
                HAS_PERMS_BY_NAME(
                    N'__schema__.[Messages]', N'OBJECT', N'ALTER'
                ) = 1
                THEN 1
            ELSE 0
        END AS BIT
    ) AS messages_alter;

SELECT p.name AS parameter_name
FROM sys.parameters AS p
WHERE p.object_id = OBJECT_ID(N'__schema__.[gap_healer_fill]', N'P')
ORDER BY p.parameter_id;
