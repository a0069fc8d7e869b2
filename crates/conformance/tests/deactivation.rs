//! docs/conformance.md#fair-share: the queues a fair claim found empty are deactivated after
//! the claim has its tasks, all in one batch (SQLite: one statement in the claim's
//! transaction; PostgreSQL: a background batch per store instance, inline when the
//! queue view has no period), and a queue with a queued task is never left inactive.
//!
//! These tests read the `dispatch_queues` rows themselves (the store's public API does not
//! show whether a queue is active), so they live beside the suite, on both backends:
//! SQLite in a temporary folder, PostgreSQL in a fresh schema of the database named by
//! `TOLLGATE_TEST_DATABASE_URL` (skipped with a notice without it;
//! `TOLLGATE_REQUIRE_POSTGRES=1` fails instead).

use async_trait::async_trait;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tollgate_conformance::START;
use tollgate_conformance::fixtures::{new_app_task, worker};
use tollgate_core::{ManualClock, NewTask, TaskId};
use tollgate_store::Store;
use tollgate_store::postgres::{PostgresOptions, PostgresStore};
use tollgate_store::sqlite::{SqliteOptions, SqliteStore};

/// The store's default view period: claims plan from the view, and PostgreSQL
/// deactivates in the background.
const DEFAULT_VIEW: Duration = Duration::from_millis(50);
/// Every claim reads the queues; PostgreSQL deactivates before the claim returns.
const NO_VIEW: Duration = Duration::ZERO;

/// One test's database, as the scenarios need it.
#[async_trait]
trait Harness: Send + Sync {
    /// A new store instance on the test's database, reusing its queue view for `ttl`.
    async fn open(&self, ttl: Duration) -> Arc<dyn Store>;
    /// Every queue row: (app, scope) → active.
    async fn queues(&self) -> BTreeMap<(String, String), bool>;
    /// Inactive queues that hold a queued task, read in one statement (one snapshot).
    async fn stranded(&self) -> Vec<(String, String)>;
    /// Queued tasks left, in any queue.
    async fn queued(&self) -> i64;
}

const STRANDED_SQL: &str = "SELECT q.app, q.scope FROM dispatch_queues q WHERE NOT q.active \
     AND EXISTS (SELECT 1 FROM tasks t WHERE t.app = q.app AND t.scope = q.scope \
     AND t.status = 'queued') ORDER BY q.app, q.scope";
const QUEUES_SQL: &str = "SELECT app, scope, active FROM dispatch_queues ORDER BY app, scope";
const QUEUED_SQL: &str = "SELECT COUNT(*) FROM tasks WHERE status = 'queued'";

/// `impl Harness for $ty`: its `open` as given, and the reads, the same statements on
/// either backend's inspector pool (`self.inspector.$pool()`).
macro_rules! impl_harness {
    ($ty:ty, $pool:ident, { $($open:tt)* }) => {
        #[async_trait]
        impl Harness for $ty {
            $($open)*

            async fn queues(&self) -> BTreeMap<(String, String), bool> {
                let rows: Vec<(String, String, bool)> = sqlx::query_as(QUEUES_SQL)
                    .fetch_all(self.inspector.$pool())
                    .await
                    .expect("read queues");
                rows.into_iter().map(|(a, s, on)| ((a, s), on)).collect()
            }

            async fn stranded(&self) -> Vec<(String, String)> {
                sqlx::query_as(STRANDED_SQL)
                    .fetch_all(self.inspector.$pool())
                    .await
                    .expect("read stranded queues")
            }

            async fn queued(&self) -> i64 {
                sqlx::query_scalar(QUEUED_SQL)
                    .fetch_one(self.inspector.$pool())
                    .await
                    .expect("count queued")
            }
        }
    };
}

struct Sqlite {
    path: std::path::PathBuf,
    clock: ManualClock,
    inspector: SqliteStore,
    _dir: tempfile::TempDir,
}

impl Sqlite {
    async fn new() -> Sqlite {
        let dir = tempfile::tempdir().expect("temporary folder");
        let path = dir.path().join("tollgate.db");
        let clock = ManualClock::new(START);
        let inspector = SqliteStore::open(SqliteOptions::new(path.clone()))
            .await
            .expect("open SQLite");
        Sqlite {
            path,
            clock,
            inspector,
            _dir: dir,
        }
    }
}

impl_harness!(Sqlite, writer_pool, {
    async fn open(&self, ttl: Duration) -> Arc<dyn Store> {
        let mut options = SqliteOptions::new(self.path.clone())
            .with_clock(Arc::new(self.clock.clone()))
            .with_queue_view_ttl(ttl);
        // Many instances share one writer lock: let them queue rather than fail.
        options.busy_timeout = Duration::from_secs(30);
        Arc::new(SqliteStore::open(options).await.expect("open SQLite"))
    }
});

struct Postgres {
    url: String,
    schema: String,
    clock: ManualClock,
    inspector: PostgresStore,
}

impl Postgres {
    /// `None` (skipped, with a notice) without a database.
    async fn new(test: &str) -> Option<Postgres> {
        let url = tollgate_conformance::postgres_url(test)?;
        let schema = format!("deact_{}", uuid::Uuid::new_v4().simple());
        let mut options = PostgresOptions::new(url.clone()).with_schema(schema.clone());
        options.max_connections = 2;
        let inspector = PostgresStore::open(options).await.expect("open PostgreSQL");
        Some(Postgres {
            url,
            schema,
            clock: ManualClock::new(START),
            inspector,
        })
    }

    async fn drop_schema(self) {
        self.inspector.close().await;
        let pool = sqlx::PgPool::connect(&self.url)
            .await
            .expect("connect to drop");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
            self.schema
        )))
        .execute(&pool)
        .await
        .expect("drop the test's schema");
        pool.close().await;
    }
}

impl_harness!(Postgres, pool, {
    async fn open(&self, ttl: Duration) -> Arc<dyn Store> {
        let mut options = PostgresOptions::new(self.url.clone())
            .with_clock(Arc::new(self.clock.clone()))
            .with_schema(self.schema.clone())
            .with_queue_view_ttl(ttl);
        options.max_connections = 4;
        options.acquire_timeout = Duration::from_secs(60);
        Arc::new(PostgresStore::open(options).await.expect("open PostgreSQL"))
    }
});

fn queue(scope: &str) -> (String, String) {
    ("acme".to_owned(), scope.to_owned())
}

async fn create(s: &dyn Store, scope: &str, key: &str) -> TaskId {
    let created = s
        .create_task(new_app_task("acme", scope, key))
        .await
        .expect("create_task");
    assert!(created.created, "{key} is new");
    created.task.id
}

/// (a) A queue a claim found empty is inactive once the claim settles: at once with a
/// view of no period (and always on SQLite), and with the background batch by the time
/// the instance's next creation starts (it waits for a batch in flight). The view
/// forgets it: a task created in it afterwards is claimed.
async fn emptied_queues_are_inactive_after_the_claim(h: &dyn Harness, ttl: Duration) {
    let s = h.open(ttl).await;
    let w = worker("w");
    for i in 0..3 {
        create(&*s, "e", &format!("e{i}-{ttl:?}")).await;
    }
    for i in 0..2 {
        create(&*s, "k", &format!("k{i}-{ttl:?}")).await;
    }
    assert_eq!(s.claim_next(&w, 10).await.expect("claim").len(), 5);
    let queues = h.queues().await;
    assert_eq!(
        (queues[&queue("e")], queues[&queue("k")]),
        (true, true),
        "a queue that gave tasks is not checked for emptiness"
    );
    // Both give nothing now: candidates, deactivated together.
    assert!(s.claim_next(&w, 10).await.expect("claim").is_empty());
    if ttl.is_zero() {
        let queues = h.queues().await;
        assert_eq!(
            (queues[&queue("e")], queues[&queue("k")]),
            (false, false),
            "deactivated before the claim returned"
        );
    }
    create(&*s, "other", &format!("o-{ttl:?}")).await;
    let queues = h.queues().await;
    assert_eq!(
        (queues[&queue("e")], queues[&queue("k")]),
        (false, false),
        "deactivated by the time the instance's next creation starts"
    );
    let again = create(&*s, "e", &format!("e-again-{ttl:?}")).await;
    let mut got = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !got.contains(&again) {
        got.extend(
            s.claim_next(&w, 10)
                .await
                .expect("claim")
                .into_iter()
                .map(|t| t.id),
        );
        assert!(
            Instant::now() < deadline,
            "a task created in a deactivated queue is never claimed"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(h.stranded().await.is_empty());
}

/// (d) A replayed creation joins no queue: after a scope's only task was claimed and its
/// queue deactivated, creating that task again (its effect key taken) answers the task
/// and leaves the queue inactive, alone and in a batch with a new task of another scope.
async fn a_replay_joins_no_queue(h: &dyn Harness, ttl: Duration) {
    let s = h.open(ttl).await;
    let w = worker("w");
    let first = create(&*s, "r", &format!("r-{ttl:?}")).await;
    assert_eq!(s.claim_next(&w, 10).await.expect("claim").len(), 1);
    assert!(s.claim_next(&w, 10).await.expect("claim").is_empty());
    // The next creation waits for a deactivation batch in flight (PostgreSQL's view).
    create(&*s, "other", &format!("o-{ttl:?}")).await;
    assert_eq!(s.claim_next(&w, 10).await.expect("claim").len(), 1);
    assert!(s.claim_next(&w, 10).await.expect("claim").is_empty());
    create(&*s, "other2", &format!("o2-{ttl:?}")).await;
    assert!(
        !h.queues().await[&queue("r")],
        "the emptied queue is inactive"
    );
    let replay = s
        .create_task(new_app_task("acme", "r", &format!("r-{ttl:?}")))
        .await
        .expect("replay");
    assert!(
        !replay.created && replay.task.id == first,
        "a replay answers the task"
    );
    let batch = s
        .create_tasks(vec![
            new_app_task("acme", "r", &format!("r-{ttl:?}")),
            new_app_task("acme", "fresh", &format!("f-{ttl:?}")),
        ])
        .await
        .expect("create_tasks");
    assert!(
        matches!(&batch[0], Ok(c) if !c.created && c.task.id == first),
        "a replay in a batch answers the task: {batch:?}"
    );
    let queues = h.queues().await;
    assert!(!queues[&queue("r")], "a replay joins no queue");
    assert!(queues[&queue("fresh")], "a new task's queue joins");
}

/// (b) Six store instances create into and claim from the same three scopes at once
/// (single and batch creations, claims of 3): no observation ever finds an inactive queue
/// holding a queued task, and claiming until nothing is queued claims every task exactly
/// once (a stranded task would never be claimed: fair claims read active queues only).
async fn racing_instances_strand_nothing(h: Arc<dyn Harness>, ttl: Duration) {
    const INSTANCES: usize = 6;
    const CREATIONS: usize = 60;
    let mut stores = Vec::new();
    for _ in 0..INSTANCES {
        stores.push(h.open(ttl).await);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let checker = {
        let h = h.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut checks = 0;
            while !stop.load(Ordering::SeqCst) {
                let stranded = h.stranded().await;
                assert!(
                    stranded.is_empty(),
                    "inactive queues with a queued task: {stranded:?}"
                );
                checks += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            checks
        })
    };
    let mut racers = Vec::new();
    for (k, s) in stores.iter().enumerate() {
        let s = s.clone();
        racers.push(tokio::spawn(async move {
            let w = worker(&format!("w{k}"));
            let (mut created, mut claimed) = (Vec::new(), Vec::new());
            for i in 0..CREATIONS {
                let scope = format!("r{}", (i + k) % 3);
                let new = new_app_task("acme", &scope, &format!("i{k}-{i}"));
                if i % 4 == 0 {
                    let more = NewTask {
                        effect_key: tollgate_conformance::fixtures::key(&format!("i{k}-{i}-b")),
                        ..new.clone()
                    };
                    for c in s.create_tasks(vec![new, more]).await.expect("create_tasks") {
                        created.push(c.expect("created").task.id);
                    }
                } else {
                    created.push(s.create_task(new).await.expect("create_task").task.id);
                }
                claimed.extend(
                    s.claim_next(&w, 3)
                        .await
                        .expect("claim")
                        .into_iter()
                        .map(|t| t.id),
                );
                if i % 7 == 0 {
                    // Claims that find the queues empty too.
                    claimed.extend(
                        s.claim_next(&w, 3)
                            .await
                            .expect("claim")
                            .into_iter()
                            .map(|t| t.id),
                    );
                }
            }
            (created, claimed)
        }));
    }
    let (mut created, mut claimed) = (Vec::new(), Vec::new());
    for r in racers {
        let (c, m) = r.await.expect("racer panicked");
        created.extend(c);
        claimed.extend(m);
    }
    // Claim until nothing is queued, with every instance.
    let deadline = Instant::now() + Duration::from_secs(30);
    let w = worker("drain");
    while h.queued().await > 0 {
        for s in &stores {
            claimed.extend(
                s.claim_next(&w, 8)
                    .await
                    .expect("claim")
                    .into_iter()
                    .map(|t| t.id),
            );
        }
        assert!(
            Instant::now() < deadline,
            "{} tasks stay queued: fair claims do not find them (stranded: {:?})",
            h.queued().await,
            h.stranded().await
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let checks = checker.await.expect("an inactive queue held a queued task");
    assert!(checks > 0);
    let mut times: HashMap<TaskId, usize> = HashMap::new();
    for id in &claimed {
        *times.entry(*id).or_default() += 1;
    }
    let twice: Vec<_> = times.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "claimed more than once: {twice:?}");
    let created: BTreeSet<TaskId> = created.into_iter().collect();
    let claimed: BTreeSet<TaskId> = claimed.into_iter().collect();
    assert_eq!(created.len(), INSTANCES * (CREATIONS + CREATIONS / 4));
    assert_eq!(created, claimed, "every created task claimed, nothing else");
}

/// (c) A creation racing the deactivation of its queue never strands its task: 150
/// times, one instance claims the last task of a scope and then claims again (the queue
/// gives nothing: deactivation) while another instance creates the scope's next task at
/// the same moment. The new task is always claimed, and no observation finds its queue
/// inactive while it is queued.
async fn a_creation_racing_the_deactivation_strands_nothing(h: &dyn Harness, ttl: Duration) {
    const ROUNDS: usize = 150;
    let (a, b) = (h.open(ttl).await, h.open(ttl).await);
    let (wa, wb) = (worker("wa"), worker("wb"));
    let first = create(&*a, "r", "r-0").await;
    let mut pending = BTreeSet::from([first]);
    for i in 1..=ROUNDS {
        // The scope's only task is claimed (by whichever instance finds it).
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pending.is_empty() {
            for (s, w) in [(&a, &wa), (&b, &wb)] {
                for t in s.claim_next(w, 4).await.expect("claim") {
                    assert!(pending.remove(&t.id), "claimed a task twice or unknown");
                }
            }
            assert!(
                Instant::now() < deadline,
                "round {i}: a task created racing a deactivation is never claimed (stranded: {:?})",
                h.stranded().await
            );
        }
        let (claimed, created) = tokio::join!(
            a.claim_next(&wa, 4),
            b.create_task(new_app_task("acme", "r", &format!("r-{i}")))
        );
        let created = created.expect("create_task").task.id;
        pending.insert(created);
        for t in claimed.expect("claim") {
            assert!(pending.remove(&t.id), "claimed a task twice or unknown");
        }
        let stranded = h.stranded().await;
        assert!(stranded.is_empty(), "round {i}: stranded {stranded:?}");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pending.is_empty() {
        for t in b.claim_next(&wb, 4).await.expect("claim") {
            pending.remove(&t.id);
        }
        assert!(Instant::now() < deadline, "the last task is never claimed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_emptied_queues_are_inactive_after_the_claim() {
    for ttl in [NO_VIEW, DEFAULT_VIEW] {
        emptied_queues_are_inactive_after_the_claim(&Sqlite::new().await, ttl).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_emptied_queues_are_inactive_after_the_claim() {
    for ttl in [NO_VIEW, DEFAULT_VIEW] {
        let Some(h) = Postgres::new("postgres_emptied_queues_are_inactive_after_the_claim").await
        else {
            return;
        };
        emptied_queues_are_inactive_after_the_claim(&h, ttl).await;
        h.drop_schema().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_racing_instances_strand_nothing() {
    racing_instances_strand_nothing(Arc::new(Sqlite::new().await), DEFAULT_VIEW).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_racing_instances_strand_nothing() {
    for ttl in [DEFAULT_VIEW, NO_VIEW] {
        let Some(h) = Postgres::new("postgres_racing_instances_strand_nothing").await else {
            return;
        };
        let h = Arc::new(h);
        racing_instances_strand_nothing(h.clone(), ttl).await;
        if let Ok(h) = Arc::try_unwrap(h) {
            h.drop_schema().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_a_creation_racing_the_deactivation_strands_nothing() {
    a_creation_racing_the_deactivation_strands_nothing(&Sqlite::new().await, DEFAULT_VIEW).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_creation_racing_the_deactivation_strands_nothing() {
    for ttl in [DEFAULT_VIEW, NO_VIEW] {
        let Some(h) =
            Postgres::new("postgres_a_creation_racing_the_deactivation_strands_nothing").await
        else {
            return;
        };
        a_creation_racing_the_deactivation_strands_nothing(&h, ttl).await;
        h.drop_schema().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_a_replay_joins_no_queue() {
    a_replay_joins_no_queue(&Sqlite::new().await, DEFAULT_VIEW).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_replay_joins_no_queue() {
    for ttl in [DEFAULT_VIEW, NO_VIEW] {
        let Some(h) = Postgres::new("postgres_a_replay_joins_no_queue").await else {
            return;
        };
        a_replay_joins_no_queue(&h, ttl).await;
        h.drop_schema().await;
    }
}
