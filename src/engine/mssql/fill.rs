//! The fill: one transaction per range (`sql/mssql/fill.sql`, or the
//! `gap_healer_fill` procedure that `sql::fill_procedure` builds from that
//! file's body and DECLAREs, so both modes run one text), and the choice
//! between the two modes.
//!
//! Inside the batch: lock the tombstone stream's row, check the leader
//! fence (the token's fence lock must still be held), refuse anything at or
//! above the highest committed position, `SET IDENTITY_INSERT ON`, insert the
//! range's tombstones in one statement from a numbers CTE, move the stream's
//! Version, `IDENTITY_INSERT OFF` on every path, commit. The batch always
//! ends with one result row, and [`errors::classify`] turns its error number
//! and stage into an outcome or an error.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tiberius::{Row, ToSql};

use super::errors::{classify, normalize, server_error, Class, Stage, LEADER_FENCE};
use super::preflight::CANNOT_IMPERSONATE;
use super::sql::{babelfish_fence_param, AppLockKey, Sql};
use super::{get, run, MssqlEngine, ProcedureState};
use crate::engine::{DbError, DbErrorKind, DbResult, Fence, FillOutcome};
use crate::gaps::PosRange;

/// Rows per fill statement: each row takes a key lock in each of the four
/// indexes of Messages, and SQL Server escalates to a table lock at about
/// 5,000 locks on one index. 4,000 stays clear of it.
pub const MAX_FILL_ROWS: u64 = 4000;

/// The lock timeout on the tombstone stream's row is longer than the one on
/// message keys, so that a second healer waits out the first one's fill (which
/// holds the row for at most about its own key timeout) and reports
/// [`FillOutcome::Busy`] only when the row stays held well beyond that.
fn stream_lock_timeout_ms(key_ms: i32) -> i32 {
    key_ms.saturating_mul(2).saturating_add(1000)
}

fn millis_i32(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

/// How this engine's login fills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FillMode {
    /// The fill batch runs as the login, which needs ALTER on Messages.
    Direct,
    /// `<schema>.gap_healer_fill` runs the same batch as its owner; the login
    /// needs only EXECUTE on it.
    Procedure,
}

impl FillMode {
    pub fn as_str(&self) -> &'static str {
        match self {
            FillMode::Direct => "direct",
            FillMode::Procedure => "procedure",
        }
    }
}

pub(crate) const MODE_UNKNOWN: u8 = 0;
const MODE_DIRECT: u8 = 1;
const MODE_PROCEDURE: u8 = 2;

/// The fill mode for what the engine learnt about the procedure: the
/// procedure when it is usable, else direct mode, except when SQL Server
/// cannot run the procedure as its owner (15517) and the login lacks the
/// ALTER on Messages that direct mode needs: falling back would fail every
/// fill with 1088 and choose again, for ever, without saying why. That is a
/// permanent error with the fix instead.
fn choose_mode(state: &ProcedureState, direct_alter: bool, procedure: &str) -> DbResult<FillMode> {
    if state.usable() {
        return Ok(FillMode::Procedure);
    }
    if let (ProcedureState::CannotImpersonate { .. }, false) = (state, direct_alter) {
        let why = state
            .problem(procedure, "", "")
            .unwrap_or_else(|| format!("{procedure} cannot run as its owner"));
        return Err(DbError {
            kind: DbErrorKind::Permanent,
            code: Some(CANNOT_IMPERSONATE.to_string()),
            message: format!(
                "neither fill mode can work: {why} (direct mode is no way out: the login has no ALTER on Messages)"
            ),
            during: None,
        });
    }
    Ok(FillMode::Direct)
}

/// The statements of fill.sql that start its table stage and its key stage.
const TABLE_STAGE: &str = "SET @stage = N'table';";
const MESSAGES_STAGE: &str = "SET @stage = N'messages';";

/// The 1-based line of `text` that holds `needle`.
fn line_of(text: &str, needle: &str) -> Option<u32> {
    let at = text.find(needle)?;
    u32::try_from(text[..at].matches('\n').count() + 1).ok()
}

/// Where the stages of a direct fill's text begin (1-based lines).
#[derive(Clone, Copy, Debug, Default)]
struct StageLines {
    table: Option<u32>,
    messages: Option<u32>,
}

impl StageLines {
    fn of(text: &str) -> StageLines {
        StageLines {
            table: line_of(text, TABLE_STAGE),
            messages: line_of(text, MESSAGES_STAGE),
        }
    }
}

/// The most direct fill texts an engine keeps: one per pair of waits its
/// fills use (a handful: `plan::fill_lock_timeouts`), so this is never
/// reached but by a configuration that changes waits at every fill.
const RENDERED_FILLS: usize = 32;

/// A direct fill's text (about 17 KB) and where its stages begin, rendered
/// once for each pair of waits and kind of server, not at every fill.
#[derive(Default)]
pub(super) struct RenderedFills {
    /// By the key wait, the stream wait and whether the server is Babelfish.
    texts: Mutex<HashMap<(i32, i32, bool), Rendered>>,
}

/// A rendered fill text and where its stages begin.
type Rendered = Arc<(String, StageLines)>;

impl RenderedFills {
    fn get(&self, sql: &Sql, key_ms: i32, stream_ms: i32, babelfish: bool) -> Rendered {
        let mut texts = self.texts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = texts.get(&(key_ms, stream_ms, babelfish)) {
            return found.clone();
        }
        if texts.len() >= RENDERED_FILLS {
            texts.clear();
        }
        let text = sql.direct_fill(key_ms, stream_ms, babelfish);
        let stages = StageLines::of(&text);
        let rendered = Arc::new((text, stages));
        texts.insert((key_ms, stream_ms, babelfish), rendered.clone());
        rendered
    }
}

/// What a lock timeout that ended the whole batch (Babelfish) means, by the
/// statement the server names (`line`, 1-based in the batch): Held in the
/// key stage, TableLocked in the table stage before it, Busy before both
/// (the tombstone stream's row). Without the lines, by the time it took:
/// Busy once it reached the stream's lock timeout. Timing alone misleads:
/// Babelfish compiles the batch first, which took over 3 s on a loaded
/// 2-core machine, so a 2 s key wait looked like the 5 s stream wait.
fn lock_timeout_outcome(
    line: Option<u32>,
    stages: StageLines,
    waited_for_the_stream: bool,
) -> FillOutcome {
    match (line.filter(|l| *l > 0), stages.messages) {
        (Some(line), Some(key_stage)) if line >= key_stage => FillOutcome::Held,
        (Some(line), Some(_)) if stages.table.is_some_and(|table| line >= table) => {
            FillOutcome::TableLocked
        }
        (Some(_), Some(_)) => FillOutcome::Busy,
        _ if waited_for_the_stream => FillOutcome::Busy,
        _ => FillOutcome::Held,
    }
}

/// Most ranges in one fill transaction (fill.sql checks it too).
pub const MAX_FILL_RANGES: usize = 1000;

/// Characters of one range in fill.sql's `@ranges`: two signed numbers of 21.
const RANGE_CHARS: usize = 42;

/// The ranges as fill.sql's `@ranges` text: each range's first and last
/// position as signed 21-character numbers, ascending. Refuses what fill.sql
/// would refuse: no ranges, more than [`MAX_FILL_RANGES`], ranges out of
/// order or overlapping, or a lock budget beyond [`MAX_FILL_ROWS`]
/// (positions plus one per range after the first).
fn encode_ranges(ranges: &[PosRange]) -> Result<String, String> {
    if ranges.is_empty() || ranges.len() > MAX_FILL_RANGES {
        return Err(format!(
            "{} ranges (1 to {MAX_FILL_RANGES} per transaction)",
            ranges.len()
        ));
    }
    if ranges.windows(2).any(|w| w[1].start() <= w[0].end()) {
        return Err("the ranges are out of order or overlap".into());
    }
    let positions: u64 = ranges.iter().map(PosRange::width).sum();
    let locks = positions + ranges.len() as u64 - 1;
    if locks > MAX_FILL_ROWS {
        return Err(format!(
            "{positions} positions in {} ranges need {locks} locks per index, more than {MAX_FILL_ROWS}",
            ranges.len()
        ));
    }
    let mut text = String::with_capacity(RANGE_CHARS * ranges.len());
    for r in ranges {
        use std::fmt::Write as _;
        let _ = write!(text, "{:+021}{:+021}", r.start(), r.end());
    }
    Ok(text)
}

/// Ranges for messages: `a..=b`, or `a..=b (+n more up to c)`.
struct Ranges<'a>(&'a [PosRange]);

impl std::fmt::Display for Ranges<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            [] => Ok(()),
            [one] => write!(f, "{one}"),
            [first, .., last] => {
                write!(
                    f,
                    "{first} (+{} more up to {})",
                    self.0.len() - 1,
                    last.end()
                )
            }
        }
    }
}

/// The name of the fence lock a fill passes to the batch: `None` unfenced.
fn fence_lock(fence: &Fence) -> Option<&str> {
    match fence {
        Fence::Unfenced => None,
        Fence::Leader(token) => Some(token.lock.as_str()),
    }
}

impl MssqlEngine {
    /// How fills run for this login: the procedure when it exists, the login
    /// may execute it, it is this version's and it writes this
    /// configuration's tombstones ([`MssqlEngine::procedure_state`]); direct
    /// otherwise (and a warning says why an installed procedure is not used).
    /// Asked once, then cached; a permanent fill error forgets the answer so
    /// the next fill asks again.
    pub async fn fill_mode(&self) -> DbResult<FillMode> {
        match self.mode.load(Ordering::Acquire) {
            MODE_DIRECT => return Ok(FillMode::Direct),
            MODE_PROCEDURE => return Ok(FillMode::Procedure),
            _ => {}
        }
        let (state, direct_alter) = self.procedure_facts().await?;
        let procedure = format!("{}.[gap_healer_fill]", self.settings.schema.tsql());
        let mode = choose_mode(&state, direct_alter, &procedure)?;
        let code = match mode {
            FillMode::Procedure => MODE_PROCEDURE,
            FillMode::Direct => MODE_DIRECT,
        };
        if self.mode.swap(code, Ordering::AcqRel) != code {
            if let Some(problem) = state.problem(
                &format!("{}.[gap_healer_fill]", self.settings.schema.tsql()),
                &self.settings.tombstone_stream,
                &self.settings.tombstone_type,
            ) {
                tracing::warn!(schema = self.settings.schema.as_str(), "{problem}");
            }
            tracing::info!(
                mode = mode.as_str(),
                schema = self.settings.schema.as_str(),
                "SQL Server fills run in {} mode",
                mode.as_str()
            );
        }
        Ok(mode)
    }

    /// The installed fill procedure as this login sees it: whether it exists
    /// and may be executed, whether its parameters are this version's
    /// (`sql/mssql/fill_mode.sql`), and, if so, which tombstones it writes: a
    /// call with NULL bounds, which writes nothing and answers with the
    /// procedure's constants. Needs no right beyond EXECUTE on it (a login
    /// with only EXECUTE cannot read the procedure's definition).
    pub(crate) async fn procedure_state(&self) -> DbResult<ProcedureState> {
        Ok(self.procedure_facts().await?.0)
    }

    /// [`MssqlEngine::procedure_state`], and whether the login has ALTER on
    /// Messages (what direct mode needs).
    async fn procedure_facts(&self) -> DbResult<(ProcedureState, bool)> {
        if self.sql.table.is_some() {
            return Ok((
                ProcedureState::Unsupported(format!(
                    "a described table ({} profile): the fill procedure writes Eventuous's Messages only, \
                     so the login needs the direct-mode rights (SELECT, INSERT, ALTER on the table)",
                    self.settings.profile.kind
                )),
                true,
            ));
        }
        let server = self.server().await?;
        if let Some(babelfish) = server.babelfish {
            return Ok((ProcedureState::Unsupported(format!(
                "{babelfish}: Babelfish cannot run a procedure WITH EXECUTE AS OWNER, so the login needs \
                 the direct-mode rights (ALTER, INSERT, SELECT on Messages; SELECT, INSERT, UPDATE on Streams)"
            )), true));
        }
        let sets = self.read(&self.sql.fill_mode, &[]).await?;
        let mut sets = sets.into_iter();
        let facts = sets.next().unwrap_or_default();
        let (exists, execute, direct_alter) = match facts.first() {
            Some(row) => (
                get::<bool>(row, "procedure_exists")?.unwrap_or(false),
                get::<bool>(row, "procedure_execute")?.unwrap_or(false),
                get::<bool>(row, "messages_alter")?.unwrap_or(false),
            ),
            None => (false, false, false),
        };
        let parameters = sets
            .next()
            .unwrap_or_default()
            .iter()
            .map(|row| {
                Ok(get::<&str>(row, "parameter_name")?
                    .unwrap_or_default()
                    .to_string())
            })
            .collect::<DbResult<Vec<String>>>()?;
        let state = self
            .describe_procedure(exists, execute, &parameters, &server.database)
            .await?;
        Ok((state, direct_alter))
    }

    /// The procedure's state from fill_mode.sql's facts and, when its
    /// parameters are this version's, a describing call.
    async fn describe_procedure(
        &self,
        exists: bool,
        execute: bool,
        parameters: &[String],
        database: &str,
    ) -> DbResult<ProcedureState> {
        if let Some(state) = ProcedureState::from_catalog(
            exists,
            execute,
            parameters,
            &self.sql.procedure_parameters,
        ) {
            return Ok(state);
        }
        let no_ranges = Option::<&str>::None;
        let no_fence = Option::<&str>::None;
        let zero = 0_i32;
        let params: [&dyn ToSql; 4] = [&no_ranges, &zero, &zero, &no_fence];
        let answer = match self.fill_batch(&self.sql.fill_call, &params).await {
            Ok(answer) => answer,
            Err(e) if e.is_transient() => return Err(e),
            Err(e) if e.code.as_deref() == Some(CANNOT_IMPERSONATE) => {
                return Ok(ProcedureState::CannotImpersonate {
                    database: database.to_string(),
                    message: e.message,
                })
            }
            Err(e) => return Ok(ProcedureState::Unanswered(e.message)),
        };
        // A fill of no range: refused by the range check, nothing written.
        if answer.error_number != Some(50002) || answer.rows_filled.is_some() {
            return Ok(ProcedureState::Unanswered(format!(
                "a call with no range answered error {:?} at {:?}",
                answer.error_number, answer.error_stage
            )));
        }
        match (&answer.stream_name, &answer.message_type) {
            (Some(stream), Some(kind)) => Ok(ProcedureState::from_description(
                stream,
                kind,
                &self.settings.tombstone_stream,
                &self.settings.tombstone_type,
            )),
            _ => Ok(ProcedureState::Unanswered(
                "its result row names no tombstone stream or type".into(),
            )),
        }
    }

    fn forget_fill_mode(&self) {
        self.mode.store(MODE_UNKNOWN, Ordering::Release);
    }

    /// `CREATE OR ALTER PROCEDURE <schema>.gap_healer_fill` for this
    /// configuration's tombstone stream and type, which become constants of
    /// the procedure: what `gap-healer install` runs. The login needs CREATE
    /// PROCEDURE in the database and ALTER on the schema.
    pub async fn install(&self) -> DbResult<()> {
        if self.sql.table.is_some() {
            return Err(DbError::permanent(format!(
                "not installed: the fill procedure writes Eventuous's Messages, and this store's table is \
                 described ({} profile), which fills in direct mode; grant the healer's login the rights \
                 that `gap-healer sql --engine mssql` lists instead",
                self.settings.profile.kind
            )));
        }
        if let Some(babelfish) = self.server().await?.babelfish {
            return Err(DbError::permanent(format!(
                "not installed: direct mode only on {babelfish} (Babelfish has no EXECUTE AS OWNER, \
                 so the procedure cannot run as its owner); grant the healer's login the direct-mode \
                 rights that `gap-healer sql --engine mssql` lists instead"
            )));
        }
        let mut session = self.checkout().await?;
        let result = session
            .client
            .execute(self.sql.fill_procedure.as_str(), &[])
            .await;
        if matches!(result, Ok(_) | Err(tiberius::error::Error::Server(_))) {
            session.clean = true;
        }
        drop(session);
        result.map_err(|e| self.driver_error(&e))?;
        self.forget_fill_mode();
        // Run it once, with no range (refused by its range check before it
        // writes anything): creating a procedure WITH EXECUTE AS OWNER
        // succeeds even when SQL Server cannot run it as that owner, which
        // only a call shows (error 15517).
        let state = self.procedure_state().await?;
        let procedure = format!("{}.[gap_healer_fill]", self.settings.schema.tsql());
        if !state.usable() {
            let why = state
                .problem(
                    &procedure,
                    &self.settings.tombstone_stream,
                    &self.settings.tombstone_type,
                )
                .unwrap_or_else(|| format!("{state:?}"));
            return Err(DbError {
                kind: DbErrorKind::Permanent,
                code: match state {
                    ProcedureState::CannotImpersonate { .. } => {
                        Some(CANNOT_IMPERSONATE.to_string())
                    }
                    _ => None,
                },
                message: format!("created {procedure}, but a call of it failed: {why}"),
                during: None,
            });
        }
        tracing::info!(
            schema = self.settings.schema.as_str(),
            tombstone_stream = %self.settings.tombstone_stream,
            tombstone_type = %self.settings.tombstone_type,
            "installed the gap_healer_fill procedure and ran it once"
        );
        Ok(())
    }

    /// Runs the fill batch or the procedure call and reads its one result
    /// row. The session goes back to the pool only when that row came back
    /// and says no transaction is open: any failure of the batch itself (it
    /// did not reach its result row) leaves the session in an unknown state,
    /// so it stays unclean and bb8 closes it, and the server rolls back
    /// whatever it had open.
    async fn fill_batch(&self, text: &str, params: &[&dyn ToSql]) -> DbResult<FillRow> {
        self.fill_batch_at(text, params)
            .await
            .map_err(|(error, _)| error)
    }

    /// [`MssqlEngine::fill_batch`], and, when a server error ended the
    /// batch before its result row, the line of the batch it names.
    async fn fill_batch_at(
        &self,
        text: &str,
        params: &[&dyn ToSql],
    ) -> Result<FillRow, (DbError, Option<u32>)> {
        let mut session = self.checkout().await.map_err(|e| (e, None))?;
        let sets = match run(&mut session.client, text, params).await {
            Ok(sets) => sets,
            Err(e) => {
                let line = match &e {
                    tiberius::error::Error::Server(token) => Some(token.line()),
                    _ => None,
                };
                let error = self.driver_error(&e);
                if error.code.as_deref() == Some("1222") && self.on_babelfish() {
                    session.clean = self.reset_after_lock_timeout(&mut session.client).await;
                }
                return Err((error, line));
            }
        };
        let answer = match sets
            .first()
            .and_then(|rows| rows.first())
            .map(FillRow::from_row)
        {
            Some(Ok(answer)) => answer,
            Some(Err(e)) => return Err((self.driver_error(&e), None)),
            None => {
                return Err((
                    DbError::transient(
                        "the fill batch returned no result row; connection discarded",
                    ),
                    None,
                ))
            }
        };
        if answer.open_transactions != 0 {
            return Err((
                DbError::transient(format!(
                    "the fill batch left {} transaction(s) open; connection discarded",
                    answer.open_transactions
                )),
                None,
            ));
        }
        session.clean = true;
        Ok(answer)
    }

    /// Whether the server is known to be Babelfish (asked once, before the
    /// first fill).
    fn on_babelfish(&self) -> bool {
        self.server.get().is_some_and(|s| s.babelfish.is_some())
    }

    /// Babelfish only: a session whose fill batch a lock timeout ended
    /// (the whole batch, its transaction rolled back), made fit for the
    /// pool again (`sql/mssql/reset_session.sql`): `true` when it answered
    /// that nothing is open. Keeping it keeps what Babelfish compiled on
    /// it; a new session compiles the fill batch again (1.6-2.7 s).
    async fn reset_after_lock_timeout(&self, client: &mut super::conn::Client) -> bool {
        match run(client, &self.sql.reset_session, &[]).await {
            Ok(sets) => {
                sets.first()
                    .and_then(|rows| rows.first())
                    .and_then(|row| row.try_get::<i32, _>("open_transactions").ok().flatten())
                    == Some(0)
            }
            Err(e) => {
                tracing::debug!(error = %self.driver_error(&e).message, "a session a lock timeout ended is closed");
                false
            }
        }
    }

    /// Babelfish only: the direct fill batch sent once for each of
    /// `lock_timeouts` with no range (its range check refuses it before it
    /// writes anything), so that Babelfish compiles it on the session the
    /// pool hands out next (the pool is LIFO) before a hole comes due: the
    /// first fill in a session otherwise spends 1.6-2.7 s compiling, more
    /// than the seed reproduction's margin; then the table-lock look and
    /// the open-transactions reading that precede every fill there (200
    /// databases: a store's first fill took 2.3-3.1 s with the batch
    /// alone compiled ahead, its later ones 1.8-2.0 s). Nothing elsewhere:
    /// SQL Server compiles a batch once for every session.
    pub(crate) async fn compile_fills(&self, lock_timeouts: &[Duration]) {
        if !matches!(self.server().await, Ok(s) if s.babelfish.is_some())
            || self.fill_mode().await.ok() != Some(FillMode::Direct)
        {
            return;
        }
        for wait in lock_timeouts {
            let key_ms = millis_i32(*wait);
            let started = Instant::now();
            let (answer, _) = self
                .run_fill(
                    FillMode::Direct,
                    String::new(),
                    key_ms,
                    &Fence::Unfenced,
                    true,
                )
                .await;
            let ms = started.elapsed().as_millis() as u64;
            match answer {
                Ok(row) if row.error_number == Some(50002) && row.rows_filled.is_none() => {
                    tracing::debug!(lock_timeout_ms = key_ms, ms, "compiled the fill batch");
                }
                Ok(row) => tracing::warn!(
                    lock_timeout_ms = key_ms,
                    error = ?row.error_number,
                    stage = %row.error_stage,
                    "the fill batch sent to be compiled answered unexpectedly"
                ),
                Err((e, _)) => {
                    tracing::debug!(error = %e.message, "the fill batch was not compiled ahead")
                }
            }
        }
        // The two reads every fill is preceded by there (the table-lock
        // look and the transaction-end proof's reading), compiled on the
        // same session: the pool hands out the session last returned.
        // Their answers here mean nothing.
        if let Err(e) = self.babelfish_table_locked().await {
            tracing::debug!(error = %e.message, "the table-lock look was not compiled ahead");
        }
        if let Err(e) = self.read_open_transactions().await {
            tracing::debug!(error = %e.message, "the open-transactions reading was not compiled ahead");
        }
    }

    /// Babelfish only, right before a fill batch: `TableLocked` when
    /// another session holds or waits for a table lock on Messages that
    /// blocks writers (an index build, `sql/mssql/table_locks.sql`), which
    /// Babelfish's table stage cannot wait for itself (it ignores the XLOCK
    /// hint).
    async fn babelfish_table_locked(&self) -> DbResult<Option<FillOutcome>> {
        let rows = self.read_first(&self.sql.table_locks, &[]).await?;
        let table_locks = match rows.first() {
            Some(row) => get::<i32>(row, "table_locks")?.unwrap_or(0),
            None => 0,
        };
        Ok((table_locks > 0).then_some(FillOutcome::TableLocked))
    }

    /// One fill transaction over `ranges` (ascending, apart), waiting at
    /// most `lock_timeout` for a message key, checked against `fence`: on
    /// Babelfish first the question whether the table is locked, then the
    /// batch in this login's [`FillMode`], and its answer read as an outcome.
    pub(crate) async fn fill_batch_of(
        &self,
        ranges: &[PosRange],
        lock_timeout: Duration,
        fence: &Fence,
    ) -> DbResult<FillOutcome> {
        let what = Ranges(ranges);
        let encoded = encode_ranges(ranges)
            .map_err(|why| DbError::permanent(format!("refused to fill {what}: {why}")))?;
        let mode = self.fill_mode().await?;
        let babelfish = self.server().await?.babelfish.is_some();
        if babelfish {
            if let Some(refused) = self.babelfish_table_locked().await? {
                return Ok(refused);
            }
        }
        let key_ms = millis_i32(lock_timeout);
        let started = Instant::now();
        let (answer, stages) = self.run_fill(mode, encoded, key_ms, fence, babelfish).await;
        let answer = match answer {
            Ok(answer) => answer,
            Err((err, line)) => {
                return self.ended_without_answer(err, line, stages, key_ms, started)
            }
        };
        self.note_answer(&what, fence, &answer);
        let outcome = self.outcome(ranges, mode, &answer);
        tracing::debug!(
            range = %what,
            mode = mode.as_str(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            outcome = ?outcome,
            "fill"
        );
        outcome
    }

    /// The fill statement for `mode` and its parameters, run: the
    /// procedure call, or the direct batch (with where its stages begin,
    /// for [`lock_timeout_outcome`]). `encoded`: the ranges as
    /// [`encode_ranges`] writes them; `key_ms`: the message keys' lock
    /// timeout.
    async fn run_fill(
        &self,
        mode: FillMode,
        encoded: String,
        key_ms: i32,
        fence: &Fence,
        babelfish: bool,
    ) -> (Result<FillRow, (DbError, Option<u32>)>, StageLines) {
        // On Babelfish the fence names the leader's session and its fence
        // lock's key, which the batch looks for in PostgreSQL's lock
        // manager (see `Sql::direct_fill`).
        let fence_name = match fence {
            Fence::Leader(token) if babelfish => Some(babelfish_fence_param(
                token.session_id,
                AppLockKey::of(&token.lock),
            )),
            _ => fence_lock(fence).map(str::to_string),
        };
        let stream_ms = stream_lock_timeout_ms(key_ms);
        let stream = self.settings.tombstone_stream.as_str();
        let kind = self.settings.tombstone_type.as_str();
        match mode {
            // The procedure's tombstone stream and type are its own constants.
            FillMode::Procedure => {
                let fence_name = fence_name.as_deref();
                let params: [&dyn ToSql; 4] = [&encoded, &key_ms, &stream_ms, &fence_name];
                let answer = self.fill_batch_at(&self.sql.fill_call, &params).await;
                // Where the batch's table and key stages begin: unknown.
                (answer, StageLines::default())
            }
            FillMode::Direct => {
                // No fence is sent as '' rather than a NULL of no type: the
                // batch reads both as none, and Babelfish refuses the
                // untyped NULL (error 8009, "Data type 0x1F is unknown").
                let fence_name = fence_name.unwrap_or_default();
                let mut params: Vec<&dyn ToSql> =
                    vec![&encoded, &stream, &kind, &key_ms, &stream_ms, &fence_name];
                // A described table's fill binds its stream row's key and
                // its tombstone row's literals after fill.sql's six.
                if let Some(table) = &self.sql.table {
                    params.push(&table.stream_key);
                    params.extend(table.literals.iter().map(|l| l.as_sql()));
                }
                let rendered = self
                    .rendered_fills
                    .get(&self.sql, key_ms, stream_ms, babelfish);
                let (text, stages) = &*rendered;
                (self.fill_batch_at(text, &params).await, *stages)
            }
        }
    }

    /// A fill batch that ended without its result row (`err`, at `line`
    /// of the batch when the server named one), begun at `started`: a
    /// lock timeout is an outcome, any other error is returned (a
    /// permanent one forgets the fill mode).
    fn ended_without_answer(
        &self,
        err: DbError,
        line: Option<u32>,
        stages: StageLines,
        key_ms: i32,
        started: Instant,
    ) -> DbResult<FillOutcome> {
        // Babelfish ends the whole batch on a lock timeout (the batch's
        // TRY/CATCH never sees it, so no result row): nothing was
        // written and the session was discarded. The wait was on a
        // message key (Held) if the statement it names comes after
        // the key stage begins, else on the tombstone stream's row
        // (Busy). Without a line, by how long it took.
        if err.code.as_deref() == Some("1222") {
            let stream_ms = stream_lock_timeout_ms(key_ms);
            let stream_wait = Duration::from_millis(u64::try_from(stream_ms).unwrap_or(0));
            return Ok(lock_timeout_outcome(
                line,
                stages,
                started.elapsed() >= stream_wait,
            ));
        }
        if err.kind == DbErrorKind::Permanent {
            self.forget_fill_mode();
        }
        Err(err)
    }

    /// What a fill's answer says beyond its outcome: a procedure created
    /// again for other tombstones (the mode is chosen again), or a fence
    /// that found the leader's lock session gone.
    fn note_answer(&self, what: &Ranges<'_>, fence: &Fence, answer: &FillRow) {
        let stream = self.settings.tombstone_stream.as_str();
        let kind = self.settings.tombstone_type.as_str();
        if (
            answer.stream_name.as_deref(),
            answer.message_type.as_deref(),
        ) != (Some(stream), Some(kind))
        {
            // The procedure was created again, for other tombstones, since
            // the mode was chosen. What happened stands; the next fill asks again.
            tracing::warn!(
                range = %what,
                stream = ?answer.stream_name,
                message_type = ?answer.message_type,
                "the fill procedure wrote or would have written other tombstones than configured; \
                 choosing the fill mode again"
            );
            self.forget_fill_mode();
        }
        if answer.error_number == Some(i32::try_from(LEADER_FENCE).unwrap_or(i32::MAX))
            && Stage::from_fill(&answer.error_stage) == Stage::Leader
        {
            if let Fence::Leader(token) = fence {
                let session_id = token.session_id;
                tracing::warn!(
                    range = %what,
                    leader_session_id = session_id,
                    "not filling: the leader lock session has ended (leader fence); another healer may lead"
                );
            }
        }
    }

    fn outcome(
        &self,
        ranges: &[PosRange],
        mode: FillMode,
        answer: &FillRow,
    ) -> DbResult<FillOutcome> {
        let width: u64 = ranges.iter().map(PosRange::width).sum();
        let range = Ranges(ranges);
        let Some(code) = answer.error_number else {
            return match answer.rows_filled {
                Some(rows) if u64::try_from(rows).ok() == Some(width) => Ok(FillOutcome::Filled { rows: width }),
                other => Err(DbError::permanent(format!(
                    "the fill of {range} committed but reported {other:?} rows for {width} positions"
                ))),
            };
        };
        let code = normalize(u32::try_from(code).unwrap_or(0), &answer.error_message);
        let stage = Stage::from_fill(&answer.error_stage);
        match classify(code, stage) {
            Class::Outcome(outcome) => Ok(outcome),
            class => {
                let mut err = server_error(
                    code,
                    stage,
                    &answer.error_message,
                    &self.settings.connection_string,
                );
                err.message = format!(
                    "fill of {range} ({} mode) failed at {}: {}",
                    mode.as_str(),
                    stage.as_str(),
                    err.message
                );
                if class == Class::Permanent {
                    self.forget_fill_mode();
                }
                Err(err)
            }
        }
    }
}

/// The one result row of the fill batch and procedure.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct FillRow {
    rows_filled: Option<i64>,
    error_number: Option<i32>,
    error_stage: String,
    error_message: String,
    open_transactions: i32,
    /// The tombstones this fill writes (procedure mode: the procedure's constants).
    stream_name: Option<String>,
    message_type: Option<String>,
}

impl FillRow {
    fn from_row(row: &Row) -> tiberius::Result<FillRow> {
        Ok(FillRow {
            rows_filled: row.try_get::<i64, _>("rows_filled")?,
            error_number: row.try_get::<i32, _>("error_number")?,
            error_stage: row
                .try_get::<&str, _>("error_stage")?
                .unwrap_or_default()
                .to_string(),
            error_message: row
                .try_get::<&str, _>("error_message")?
                .unwrap_or_default()
                .to_string(),
            open_transactions: row.try_get::<i32, _>("open_transactions")?.unwrap_or(-1),
            stream_name: row.try_get::<&str, _>("stream_name")?.map(str::to_string),
            message_type: row.try_get::<&str, _>("message_type")?.map(str::to_string),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::mssql::sql::Sql;
    use crate::engine::tests_support::mssql_settings as settings;
    use crate::engine::FenceToken;

    fn r(a: i64, b: i64) -> PosRange {
        PosRange::new(a, b).unwrap()
    }

    #[test]
    fn lock_timeouts() {
        assert_eq!(millis_i32(Duration::from_secs(2)), 2000);
        assert_eq!(millis_i32(Duration::from_secs(u64::MAX)), i32::MAX);
        assert_eq!(stream_lock_timeout_ms(2000), 5000);
        assert_eq!(stream_lock_timeout_ms(i32::MAX), i32::MAX);
        assert!(stream_lock_timeout_ms(0) > 0);
    }

    #[test]
    fn fill_outcomes_from_result_rows() {
        let engine = MssqlEngine::new(&settings("Server=db;User Id=app;Password=x")).unwrap();
        let range = r(10, 12);
        let row = |code: Option<i32>, stage: &str| FillRow {
            rows_filled: if code.is_none() { Some(3) } else { None },
            error_number: code,
            error_stage: stage.into(),
            error_message: "message".into(),
            open_transactions: 0,
            stream_name: Some("__tombstones__".into()),
            message_type: Some("$tombstone".into()),
        };
        let m = FillMode::Direct;
        assert_eq!(
            engine.outcome(&[range], m, &row(None, "commit")),
            Ok(FillOutcome::Filled { rows: 3 })
        );
        assert_eq!(
            engine.outcome(&[range], m, &row(Some(2627), "messages")),
            Ok(FillOutcome::Committed)
        );
        assert_eq!(
            engine.outcome(&[range], m, &row(Some(2601), "messages")),
            Ok(FillOutcome::Committed)
        );
        assert_eq!(
            engine.outcome(&[range], m, &row(Some(1222), "messages")),
            Ok(FillOutcome::Held)
        );
        assert_eq!(
            engine.outcome(&[range], m, &row(Some(1222), "stream")),
            Ok(FillOutcome::Busy)
        );
        assert_eq!(
            engine.outcome(&[range], m, &row(Some(1222), "table")),
            Ok(FillOutcome::TableLocked)
        );
        // The leader fence: this process no longer leads.
        assert_eq!(
            engine.outcome(&[range], m, &row(Some(50006), "leader")),
            Ok(FillOutcome::Busy)
        );
        assert_eq!(
            engine.outcome(&[range], FillMode::Procedure, &row(Some(50006), "leader")),
            Ok(FillOutcome::Busy)
        );
        let deadlock = engine
            .outcome(&[range], m, &row(Some(1205), "messages"))
            .unwrap_err();
        assert!(deadlock.is_transient());
        assert_eq!(deadlock.code.as_deref(), Some("1205"));
        let above = engine
            .outcome(&[range], m, &row(Some(50005), "head"))
            .unwrap_err();
        assert_eq!(above.kind, DbErrorKind::Permanent);
        assert!(
            above.message.contains("failed at head"),
            "{}",
            above.message
        );
        let wrong_count = FillRow {
            rows_filled: Some(2),
            ..row(None, "commit")
        };
        assert!(engine.outcome(&[range], m, &wrong_count).is_err());
    }

    /// Review finding: the 17 KB fill text was rendered at every fill. It
    /// is rendered once per pair of waits and kind of server.
    #[test]
    fn a_fill_text_is_rendered_once_for_its_waits() {
        let sql = Sql::new(&crate::engine::Ident::parse("eventuous").unwrap(), "s", "t").unwrap();
        let rendered = RenderedFills::default();
        let first = rendered.get(&sql, 2000, 5000, true);
        assert!(Arc::ptr_eq(&first, &rendered.get(&sql, 2000, 5000, true)));
        assert_eq!(first.0, sql.direct_fill(2000, 5000, true));
        assert!(first.1.messages.is_some() && first.1.table.is_some());
        let other = rendered.get(&sql, 2000, 5000, false);
        assert!(!Arc::ptr_eq(&first, &other));
        assert_eq!(other.0, sql.direct_fill(2000, 5000, false));
        for ms in 0..2 * RENDERED_FILLS as i32 {
            rendered.get(&sql, ms, 5000, false);
        }
        let kept = rendered.texts.lock().unwrap().len();
        assert!(kept <= RENDERED_FILLS, "{kept}");
    }

    /// Babelfish: a lock timeout ends the batch, and its line says where.
    #[test]
    fn a_lock_timeout_that_ends_the_batch_is_placed_by_its_line() {
        let text = Sql::new(&crate::engine::Ident::parse("eventuous").unwrap(), "s", "t")
            .unwrap()
            .direct_fill(2000, 5000, false);
        let stages = StageLines::of(&text);
        let key = stages.messages.expect("the key stage");
        let table = stages.table.expect("the table stage");
        let stream = line_of(&text, "WITH (UPDLOCK, ROWLOCK)").unwrap();
        let intent = line_of(&text, "WITH (XLOCK, ROWLOCK)").unwrap();
        let insert = line_of(&text, "INSERT INTO [eventuous].[Messages]").unwrap();
        assert!(stream < table && table < intent && intent < key && key < insert);
        // The numbers CTE that starts the insert statement is in the key stage.
        assert!(line_of(&text, "    WITH\n    digits").is_some_and(|w| w > key));
        assert_eq!(
            lock_timeout_outcome(Some(insert), stages, true),
            FillOutcome::Held
        );
        assert_eq!(
            lock_timeout_outcome(Some(intent), stages, false),
            FillOutcome::TableLocked
        );
        assert_eq!(
            lock_timeout_outcome(Some(stream), stages, false),
            FillOutcome::Busy
        );
        assert_eq!(lock_timeout_outcome(None, stages, true), FillOutcome::Busy);
        assert_eq!(
            lock_timeout_outcome(Some(0), stages, false),
            FillOutcome::Held
        );
        assert_eq!(line_of("a\nb\nc", "c"), Some(3));
    }

    /// Issue 11 item 5: up to 1,000 ranges per transaction, within a lock
    /// budget of 4,000 per index (positions, plus one page of the clustered
    /// key per range after the first), as fill.sql's @ranges text.
    #[test]
    fn ranges_are_encoded_for_fill_sql_within_the_lock_budget() {
        assert_eq!(
            encode_ranges(&[r(7, 9), r(12, 12)]).unwrap(),
            "+00000000000000000007+00000000000000000009+00000000000000000012+00000000000000000012"
        );
        assert_eq!(
            encode_ranges(&[r(-3, -1)]).unwrap(),
            "-00000000000000000003-00000000000000000001"
        );
        let max = encode_ranges(&[r(i64::MAX - 1, i64::MAX)]).unwrap();
        assert_eq!(max.len(), RANGE_CHARS);
        assert!(encode_ranges(&[r(1, 4_000)]).is_ok());
        assert!(encode_ranges(&[r(1, 4_001)]).is_err());
        let singles: Vec<PosRange> = (0..1_000).map(|i| r(i * 3, i * 3)).collect();
        assert_eq!(encode_ranges(&singles).unwrap().len(), 1_000 * RANGE_CHARS);
        let too_many: Vec<PosRange> = (0..1_001).map(|i| r(i * 3, i * 3)).collect();
        assert!(encode_ranges(&too_many).is_err());
        // 2,001 positions in two ranges: 2,002 locks, fine; 3,999 + 1 + 1: not.
        assert!(encode_ranges(&[r(1, 2_000), r(3_000, 3_000)]).is_ok());
        assert!(encode_ranges(&[r(1, 3_999), r(5_000, 5_000)]).is_err());
        assert!(encode_ranges(&[]).is_err());
        assert!(encode_ranges(&[r(5, 9), r(9, 12)]).is_err(), "overlap");
        assert!(encode_ranges(&[r(20, 21), r(5, 9)]).is_err(), "order");
        assert_eq!(
            Ranges(&[r(1, 2), r(5, 5), r(9, 10)]).to_string(),
            "1..=2 (+2 more up to 10)"
        );
        assert_eq!(Ranges(&[r(4, 4)]).to_string(), "4");
    }

    /// Review finding F4: 15517 without direct-mode rights used to fall
    /// back to direct mode, fail with 1088, forget the mode and do it all
    /// again on every fill; now it is one permanent error with the fix.
    #[test]
    fn a_procedure_that_cannot_run_as_its_owner_is_an_error_without_alter() {
        let p = "[eventuous].[gap_healer_fill]";
        let broken = ProcedureState::CannotImpersonate {
            database: "orders".into(),
            message: "SQL Server error 15517: Cannot execute as the database principal".into(),
        };
        let err = choose_mode(&broken, false, p).unwrap_err();
        assert_eq!(err.kind, DbErrorKind::Permanent);
        assert_eq!(err.code.as_deref(), Some("15517"));
        assert!(
            err.message
                .contains("ALTER AUTHORIZATION ON DATABASE::[orders] TO [sa];"),
            "{}",
            err.message
        );
        assert_eq!(choose_mode(&broken, true, p), Ok(FillMode::Direct));
        assert_eq!(
            choose_mode(&ProcedureState::Usable, false, p),
            Ok(FillMode::Procedure)
        );
        for other in [ProcedureState::Absent, ProcedureState::NoExecute] {
            assert_eq!(choose_mode(&other, false, p), Ok(FillMode::Direct));
        }
    }

    #[test]
    fn the_fence_lock_comes_from_the_token() {
        assert_eq!(fence_lock(&Fence::Unfenced), None);
        let token = FenceToken {
            session_id: 70_000,
            lock: "gap-healer fence 70000 x".into(),
        };
        assert_eq!(
            fence_lock(&Fence::Leader(token)),
            Some("gap-healer fence 70000 x")
        );
    }
}
