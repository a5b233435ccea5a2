//! The shared backend: PostgreSQL (or a Postgres-compatible database), for
//! several `byom server` replicas at once.
//!
//! One table holds every [`Space`] (`byom_kv`: space, key, value, keyed by
//! both), so a batch across spaces is a single statement and so atomic
//! without a client-side transaction. Every operation is one statement;
//! statements are prepared once per connection and pipelined, so a small
//! pool carries many concurrent callers.
//!
//! Every write is durable when it returns (`synchronous_commit` at least
//! `on`), so [`Backend::flush`] has nothing left to do: a command's
//! creation and its end cost one statement each, not a write and then a
//! flush of four more statements. Concurrent commits share their WAL
//! fsyncs (PostgreSQL's own group commit), and writes nobody waits on
//! durably (a heartbeat, an output chunk) are few and small.
//!
//! The trait is blocking; the connections run on a runtime of their own
//! and callers wait for them (in `block_in_place` on a multi-threaded
//! runtime, so the caller's other tasks move to another thread).

use std::collections::HashMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio_postgres::{Client, Statement};

use crate::backend::{Backend, Guard, Kv, Op, Space};
use crate::pg_tls::{self, Target};
use crate::{Result, StoreError};

/// Connections per server.
pub const POOL_SIZE: usize = 4;

/// The newest schema this build knows. A database at a newer version is
/// refused: an older byom must not write rows it does not understand.
pub const SCHEMA_VERSION: i32 = 1;

/// Each step takes the schema from the version before it to its index + 1.
const MIGRATIONS: [&str; 1] = [
    // 1: one table for every keyspace; a row per server process for
    // flushes (unused since writes commit durably; kept so that servers of
    // both builds can share a database while they are upgraded).
    "CREATE TABLE byom_kv (
         space text NOT NULL,
         k bytea NOT NULL,
         v bytea NOT NULL,
         PRIMARY KEY (space, k)
     );
     CREATE TABLE byom_flush (id bigint PRIMARY KEY, n bigint NOT NULL);",
];

/// Any arbitrary number, the same in every build: the lock concurrent
/// replicas take while one of them migrates.
const MIGRATION_LOCK: i64 = 0x6279_6f6d_5f6d_6967;

fn pg(e: tokio_postgres::Error) -> StoreError {
    if let Some(db) = e.as_db_error() {
        let msg = format!("PostgreSQL: {}", db.message());
        // Connection exceptions, and a server shutting down, starting up
        // or out of connections: a moment later it may answer.
        let code = db.code().code();
        return if code.starts_with("08") || code.starts_with("57P") || code == "53300" {
            StoreError::Unreachable(msg)
        } else {
            StoreError::Database(msg)
        };
    }
    // The cause (a refused certificate, an unreachable host) is in the
    // sources.
    let mut msg = format!("PostgreSQL: {e}");
    let mut lost = e.is_closed();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        msg.push_str(&format!(": {c}"));
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            lost |= matches!(
                io.kind(),
                ConnectionRefused
                    | ConnectionReset
                    | ConnectionAborted
                    | NotConnected
                    | BrokenPipe
                    | TimedOut
                    | UnexpectedEof
            );
        }
        cause = c.source();
    }
    if lost {
        StoreError::Unreachable(msg)
    } else {
        StoreError::Database(msg)
    }
}

/// The statements of one connection.
struct Conn {
    client: Client,
    get: Statement,
    get_many: Statement,
    put: Statement,
    delete: Statement,
    cas_insert: Statement,
    cas_update: Statement,
    cas_delete: Statement,
    keys: Statement,
    batch: Statement,
    batch_if: Statement,
    notify: Statement,
    /// Keyed by (start excluded, end: 0 unbounded / 1 excluded / 2
    /// included, reverse).
    ranges: HashMap<(bool, u8, bool), Statement>,
}

const BATCH_SQL: &str = "WITH d AS (
        DELETE FROM byom_kv USING unnest($1::text[], $2::bytea[]) AS x(s, k)
        WHERE byom_kv.space = x.s AND byom_kv.k = x.k
    )
    INSERT INTO byom_kv (space, k, v)
    SELECT * FROM unnest($3::text[], $4::bytea[], $5::bytea[])
    ON CONFLICT (space, k) DO UPDATE SET v = EXCLUDED.v";

/// [`BATCH_SQL`] if the guard row holds its value. `FOR SHARE` makes a
/// concurrent change of the guard (a lease taken over) either wait for
/// this write or, once committed first, fail the guard.
const BATCH_IF_SQL: &str = "WITH g AS (
        SELECT 1 FROM byom_kv WHERE space = $6 AND k = $7 AND v = $8 FOR SHARE
    ), d AS (
        DELETE FROM byom_kv USING unnest($1::text[], $2::bytea[]) AS x(s, k)
        WHERE byom_kv.space = x.s AND byom_kv.k = x.k AND EXISTS (SELECT 1 FROM g)
    ), i AS (
        INSERT INTO byom_kv (space, k, v)
        SELECT * FROM unnest($3::text[], $4::bytea[], $5::bytea[])
        WHERE EXISTS (SELECT 1 FROM g)
        ON CONFLICT (space, k) DO UPDATE SET v = EXCLUDED.v
    )
    SELECT count(*) FROM g";

impl Conn {
    async fn open(target: &Target) -> Result<Conn> {
        let (client, connection) = connect(target).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!("PostgreSQL connection ended: {e}");
            }
        });
        durable_commits(&client).await?;
        let p = |sql: &'static str| {
            let c = &client;
            async move { c.prepare(sql).await.map_err(pg) }
        };
        let mut ranges = HashMap::new();
        for start_excluded in [false, true] {
            for end in 0..3u8 {
                for reverse in [false, true] {
                    let sql = format!(
                        "SELECT k, v FROM byom_kv WHERE space = $1 AND k {} $2 {} ORDER BY k {} LIMIT $4",
                        if start_excluded { ">" } else { ">=" },
                        match end {
                            0 => "AND $3::bytea IS NULL",
                            1 => "AND k < $3",
                            _ => "AND k <= $3",
                        },
                        if reverse { "DESC" } else { "ASC" },
                    );
                    let st = client.prepare(&sql).await.map_err(pg)?;
                    ranges.insert((start_excluded, end, reverse), st);
                }
            }
        }
        Ok(Conn {
            get: p("SELECT v FROM byom_kv WHERE space = $1 AND k = $2").await?,
            get_many: p("SELECT k, v FROM byom_kv WHERE space = $1 AND k = ANY($2)").await?,
            put: p("INSERT INTO byom_kv (space, k, v) VALUES ($1, $2, $3)
                    ON CONFLICT (space, k) DO UPDATE SET v = EXCLUDED.v")
            .await?,
            delete: p("DELETE FROM byom_kv WHERE space = $1 AND k = $2").await?,
            cas_insert: p("INSERT INTO byom_kv (space, k, v) VALUES ($1, $2, $3)
                           ON CONFLICT (space, k) DO NOTHING")
            .await?,
            cas_update: p("UPDATE byom_kv SET v = $4 WHERE space = $1 AND k = $2 AND v = $3")
                .await?,
            cas_delete: p("DELETE FROM byom_kv WHERE space = $1 AND k = $2 AND v = $3").await?,
            keys: p("SELECT k FROM byom_kv WHERE space = $1 ORDER BY k").await?,
            batch: p(BATCH_SQL).await?,
            batch_if: p(BATCH_IF_SQL).await?,
            notify: p("SELECT pg_notify($1, $2)").await?,
            ranges,
            client,
        })
    }
}

/// Makes this connection's commits wait for their WAL on disk, unless the
/// database already asks for that or more (`remote_apply` for a standby,
/// say): a server configured with `synchronous_commit = off` would
/// otherwise acknowledge commands a crash can lose.
async fn durable_commits(client: &Client) -> Result<()> {
    let row = client
        .query_one("SHOW synchronous_commit", &[])
        .await
        .map_err(pg)?;
    let level: String = row.get(0);
    if level == "off" {
        client
            .batch_execute("SET synchronous_commit = on")
            .await
            .map_err(pg)?;
    }
    Ok(())
}

pub struct PgBackend {
    /// Where the database is and how to reach it, for reconnecting.
    target: Arc<Target>,
    /// The connections' own runtime: the trait is blocking, and a caller
    /// on any runtime (or none) can wait for it.
    rt: Option<tokio::runtime::Runtime>,
    pool: Arc<Vec<tokio::sync::RwLock<Arc<Conn>>>>,
    next: AtomicUsize,
    notices: tokio::sync::broadcast::Sender<String>,
}

/// The channel replicas tell each other on (`LISTEN`/`NOTIFY`).
const CHANNEL: &str = "byom";
/// Notices a slow listener may fall behind by before it is told to look
/// again (`*`).
const NOTICE_BUFFER: usize = 4096;
/// The longest notice PostgreSQL carries is 8000 bytes.
const MAX_NOTICE_BYTES: usize = 7900;

impl PgBackend {
    /// Connects, applies the migrations this build knows (refusing a newer
    /// schema) and opens the pool.
    pub fn connect(url: &str) -> Result<PgBackend> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("byom-postgres")
            .enable_all()
            .build()
            .map_err(|e| {
                StoreError::Database(format!("cannot start the PostgreSQL runtime: {e}"))
            })?;
        let target = Arc::new(pg_tls::parse(url)?);
        if let Some(risk) = target.risk() {
            tracing::warn!("{risk}");
        }
        let t = target.clone();
        let pool = wait(rt.handle(), async move {
            migrate(&t).await?;
            let mut pool = Vec::new();
            for _ in 0..POOL_SIZE {
                pool.push(tokio::sync::RwLock::new(Arc::new(Conn::open(&t).await?)));
            }
            Ok(pool)
        })?;
        let (notices, _) = tokio::sync::broadcast::channel(NOTICE_BUFFER);
        rt.spawn(listen(target.clone(), notices.clone()));
        Ok(PgBackend {
            target,
            rt: Some(rt),
            pool: Arc::new(pool),
            next: AtomicUsize::new(0),
            notices,
        })
    }

    /// Runs `f` on a live connection (reopening one that died, after a
    /// database restart say) and waits for its result.
    fn run<T, F, Fut>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Conn>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T>> + Send,
    {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.pool.len();
        let (pool, target) = (self.pool.clone(), self.target.clone());
        let Some(rt) = &self.rt else {
            return Err(StoreError::Database(
                "the PostgreSQL store is closed".into(),
            ));
        };
        wait(rt.handle(), async move {
            let slot = &pool[i];
            let c = slot.read().await.clone();
            let conn = if c.client.is_closed() {
                let mut w = slot.write().await;
                if w.client.is_closed() {
                    *w = Arc::new(Conn::open(&target).await?);
                }
                w.clone()
            } else {
                c
            };
            f(conn).await
        })
    }
}

impl Drop for PgBackend {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which a caller's runtime forbids.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Runs `fut` on `rt` and blocks until it is done, without stalling the
/// caller's runtime (if it has threads to spare).
fn wait<T: Send + 'static>(
    rt: &tokio::runtime::Handle,
    fut: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    rt.spawn(async move {
        let _ = tx.send(fut.await);
    });
    let recv = || {
        rx.recv().unwrap_or_else(|_| {
            Err(StoreError::Database(
                "the PostgreSQL store is closed".into(),
            ))
        })
    };
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(recv)
        }
        _ => recv(),
    }
}

/// How long connecting to the database may take, unless the URL says
/// (`connect_timeout=`): an unreachable database is an error, not a hang.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

async fn connect(
    target: &Target,
) -> Result<(
    Client,
    tokio_postgres::Connection<tokio_postgres::Socket, pg_tls::PgTls<tokio_postgres::Socket>>,
)> {
    let mut cfg = target.config.clone();
    if cfg.get_connect_timeout().is_none() {
        cfg.connect_timeout(CONNECT_TIMEOUT);
    }
    cfg.connect(target.tls.clone()).await.map_err(pg)
}

/// Hears every replica's notices, for as long as the backend lives:
/// reconnects after a lost connection, and then says `*` (some may have
/// been missed).
async fn listen(target: Arc<Target>, tx: tokio::sync::broadcast::Sender<String>) {
    use futures_util::StreamExt;
    loop {
        match connect(&target).await {
            Ok((client, mut connection)) => {
                let notes = tx.clone();
                let driver = tokio::spawn(async move {
                    let mut messages =
                        futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
                    while let Some(m) = messages.next().await {
                        match m {
                            Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                                let _ = notes.send(n.payload().to_string());
                            }
                            Ok(_) => {}
                            Err(e) => {
                                tracing::warn!("lost the store's notice connection: {e}");
                                break;
                            }
                        }
                    }
                });
                match client.batch_execute(&format!("LISTEN {CHANNEL}")).await {
                    Ok(()) => {
                        let _ = tx.send("*".into());
                    }
                    Err(e) => tracing::warn!("cannot listen for the store's notices: {}", pg(e)),
                }
                let _ = driver.await;
            }
            Err(e) => tracing::warn!("cannot open the store's notice connection: {e}"),
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// Brings the schema to [`SCHEMA_VERSION`], one step per transaction,
/// under a lock so replicas starting together migrate once.
async fn migrate(target: &Target) -> Result<()> {
    let (mut client, connection) = connect(target).await?;
    let driver = tokio::spawn(connection);
    let r = async {
        client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS byom_schema (
                     id int PRIMARY KEY CHECK (id = 1),
                     version int NOT NULL
                 )",
            )
            .await
            .map_err(pg)?;
        let tx = client.transaction().await.map_err(pg)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(pg)?;
        let found: i32 = tx
            .query_opt("SELECT version FROM byom_schema WHERE id = 1", &[])
            .await
            .map_err(pg)?
            .map_or(0, |r| r.get(0));
        if found > SCHEMA_VERSION {
            return Err(StoreError::Database(format!(
                "the store's schema is version {found}, newer than this byom knows \
                 ({SCHEMA_VERSION}): run the newer byom, or upgrade this one"
            )));
        }
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
            tx.batch_execute(sql).await.map_err(pg)?;
            tracing::info!(version = i + 1, "applied a store schema migration");
        }
        tx.execute(
            "INSERT INTO byom_schema (id, version) VALUES (1, $1)
             ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version",
            &[&SCHEMA_VERSION],
        )
        .await
        .map_err(pg)?;
        tx.commit().await.map_err(pg)
    }
    .await;
    drop(client);
    let _ = driver.await;
    r
}

/// The last write per key wins, as it would applied in order: one row
/// may appear only once in a statement.
fn dedupe(ops: &[Op]) -> Vec<&Op> {
    let mut last: HashMap<(Space, &[u8]), usize> = HashMap::new();
    for (i, op) in ops.iter().enumerate() {
        last.insert((op.space, &op.key), i);
    }
    let mut keep: Vec<usize> = last.into_values().collect();
    keep.sort_unstable();
    keep.into_iter().map(|i| &ops[i]).collect()
}

fn bound(b: Bound<&[u8]>) -> (Option<Vec<u8>>, bool) {
    match b {
        Bound::Unbounded => (None, false),
        Bound::Excluded(k) => (Some(k.to_vec()), true),
        Bound::Included(k) => (Some(k.to_vec()), false),
    }
}

impl Backend for PgBackend {
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let key = key.to_vec();
        self.run(move |c| async move {
            let row = c
                .client
                .query_opt(&c.get, &[&space.name(), &key])
                .await
                .map_err(pg)?;
            Ok(row.map(|r| r.get(0)))
        })
    }
    fn get_many(&self, space: Space, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let wanted = keys.to_vec();
        let found: HashMap<Vec<u8>, Vec<u8>> = self.run(move |c| async move {
            let rows = c
                .client
                .query(&c.get_many, &[&space.name(), &wanted])
                .await
                .map_err(pg)?;
            Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
        })?;
        Ok(keys.iter().map(|k| found.get(k).cloned()).collect())
    }
    fn put(&self, space: Space, key: &[u8], value: &[u8]) -> Result<()> {
        let (key, value) = (key.to_vec(), value.to_vec());
        self.run(move |c| async move {
            c.client
                .execute(&c.put, &[&space.name(), &key, &value])
                .await
                .map_err(pg)?;
            Ok(())
        })
    }
    fn delete(&self, space: Space, key: &[u8]) -> Result<()> {
        let key = key.to_vec();
        self.run(move |c| async move {
            c.client
                .execute(&c.delete, &[&space.name(), &key])
                .await
                .map_err(pg)?;
            Ok(())
        })
    }
    fn compare_and_swap(
        &self,
        space: Space,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool> {
        let (key, old, new) = (
            key.to_vec(),
            old.map(<[u8]>::to_vec),
            new.map(<[u8]>::to_vec),
        );
        self.run(move |c| async move {
            let s = space.name();
            let n = match (old, new) {
                (None, Some(new)) => c.client.execute(&c.cas_insert, &[&s, &key, &new]).await,
                (Some(old), Some(new)) => {
                    c.client
                        .execute(&c.cas_update, &[&s, &key, &old, &new])
                        .await
                }
                (Some(old), None) => c.client.execute(&c.cas_delete, &[&s, &key, &old]).await,
                (None, None) => {
                    let row = c.client.query_opt(&c.get, &[&s, &key]).await.map_err(pg)?;
                    return Ok(row.is_none());
                }
            }
            .map_err(pg)?;
            Ok(n == 1)
        })
    }
    fn range(
        &self,
        space: Space,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        reverse: bool,
        limit: usize,
    ) -> Result<Vec<Kv>> {
        let (start, start_excluded) = bound(start);
        // Every key is >= the empty key.
        let start = start.unwrap_or_default();
        let (end_key, end_excluded) = bound(end);
        let end_kind = match (&end_key, end_excluded) {
            (None, _) => 0u8,
            (Some(_), true) => 1,
            (Some(_), false) => 2,
        };
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run(move |c| async move {
            let st = &c.ranges[&(start_excluded, end_kind, reverse)];
            let rows = c
                .client
                .query(st, &[&space.name(), &start, &end_key, &limit])
                .await
                .map_err(pg)?;
            Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
        })
    }
    fn keys(&self, space: Space) -> Result<Vec<Vec<u8>>> {
        self.run(move |c| async move {
            let rows = c
                .client
                .query(&c.keys, &[&space.name()])
                .await
                .map_err(pg)?;
            Ok(rows.into_iter().map(|r| r.get(0)).collect())
        })
    }
    fn flush(&self) -> Result<()> {
        // Every write committed durably before it returned.
        Ok(())
    }
    fn writes_are_durable(&self) -> bool {
        true
    }
    fn is_shared(&self) -> bool {
        true
    }
    fn notify(&self, note: &str) -> Result<()> {
        let mut end = note.len().min(MAX_NOTICE_BYTES);
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        let note = note[..end].to_string();
        let pool = self.pool.clone();
        let Some(rt) = &self.rt else {
            return Ok(());
        };
        let i = self.next.fetch_add(1, Ordering::Relaxed) % pool.len();
        // Not waited for: the writes it follows have committed, so it
        // cannot overtake them, and a lost notice is what the replicas'
        // periodic look is for.
        rt.spawn(async move {
            let conn = pool[i].read().await.clone();
            if let Err(e) = conn.client.execute(&conn.notify, &[&CHANNEL, &note]).await {
                tracing::debug!("notice not sent: {}", pg(e));
            }
        });
        Ok(())
    }
    fn notices(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        Some(self.notices.subscribe())
    }
    fn batch(&self, ops: &[Op]) -> Result<()> {
        let Columns(ds, dk, ps, pk, pv) = columns(ops);
        self.run(move |c| async move {
            c.client
                .execute(&c.batch, &[&ds, &dk, &ps, &pk, &pv])
                .await
                .map_err(pg)?;
            Ok(())
        })
    }
    fn batch_if(&self, guard: &Guard, ops: &[Op]) -> Result<bool> {
        let Columns(ds, dk, ps, pk, pv) = columns(ops);
        let (gs, gk, gv) = (guard.space.name(), guard.key.clone(), guard.value.clone());
        self.run(move |c| async move {
            let row = c
                .client
                .query_one(&c.batch_if, &[&ds, &dk, &ps, &pk, &pv, &gs, &gk, &gv])
                .await
                .map_err(pg)?;
            Ok(row.get::<_, i64>(0) == 1)
        })
    }
}

/// A batch as the columns of its deletes (space, key) and its puts
/// (space, key, value), each row once.
struct Columns(
    Vec<&'static str>,
    Vec<Vec<u8>>,
    Vec<&'static str>,
    Vec<Vec<u8>>,
    Vec<Vec<u8>>,
);

fn columns(ops: &[Op]) -> Columns {
    let mut c = Columns(Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for op in dedupe(ops) {
        match &op.value {
            None => {
                c.0.push(op.space.name());
                c.1.push(op.key.clone());
            }
            Some(v) => {
                c.2.push(op.space.name());
                c.3.push(op.key.clone());
                c.4.push(v.clone());
            }
        }
    }
    c
}
