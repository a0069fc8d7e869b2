//! Notifications across replicas: two engines on one database, each with its own
//! notifier on a real transport (NATS at 127.0.0.1:4222, PostgreSQL `LISTEN/NOTIFY`).
//! Polling is set to 30 s, so only the transport can make the worker claim and the
//! waiter wake within seconds.

mod common;

use common::*;
use std::time::Duration;
use tokio::time::Instant;
use tollgate_core::TaskStatus;
use tollgate_engine::{EngineConfig, Event, Notifier, Tollgate};

const NATS_URL: &str = "nats://127.0.0.1:4222";

/// NATS is reachable, or the test is skipped with a notice (failed when
/// `TOLLGATE_REQUIRE_NATS=1`).
async fn nats_available(test: &str) -> bool {
    let reachable = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect("127.0.0.1:4222"),
    )
    .await
    .is_ok_and(|r| r.is_ok());
    if !reachable {
        if std::env::var("TOLLGATE_REQUIRE_NATS").is_ok_and(|v| v == "1") {
            panic!("TOLLGATE_REQUIRE_NATS=1 but NATS is not reachable at 127.0.0.1:4222");
        }
        eprintln!("skipping {test}: NATS is not reachable at 127.0.0.1:4222");
    }
    reachable
}

fn slow_polling() -> EngineConfig {
    let mut config = fast_config();
    config.notifications.poll_interval = Duration::from_secs(30);
    config
}

/// Replica `worker` runs tasks that replica `client` submits and waits for.
async fn hints_cross_replicas(db: &TestDb, worker_notifier: Notifier, client_notifier: Notifier) {
    let worker = Tollgate::builder(db.store().await, slow_polling())
        .notifier(worker_notifier)
        .build()
        .unwrap();
    let client = Tollgate::builder(db.store().await, slow_polling())
        .notifier(client_notifier)
        .build()
        .unwrap();
    let handle = worker.start().await.unwrap();
    // Let the worker's first (empty) poll pass, so the next claim needs a hint.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut heard = client.notifier().subscribe();
    let started = Instant::now();
    let id = client
        .submit(classify("cross", "hello"))
        .await
        .unwrap()
        .task
        .id;
    let task = client
        .wait(&app(), id, Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    let took = started.elapsed();
    assert_eq!(task.status, TaskStatus::Succeeded, "{task:?}");
    assert!(
        took < Duration::from_secs(5),
        "took {took:?}: with 30 s polling only notifications are this fast"
    );
    // The client heard the other replica's finish event (its own queued event is local).
    let finished_event = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match heard.recv().await {
                Ok(Event::TaskFinished {
                    id: finished,
                    status,
                    ..
                }) if finished == id => {
                    return status;
                }
                Ok(_) => {}
                Err(e) => panic!("notifier closed: {e}"),
            }
        }
    })
    .await
    .expect("the finish was heard");
    assert_eq!(finished_event, Some(TaskStatus::Succeeded));
    handle.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_carries_hints_between_replicas() {
    if !nats_available("nats_carries_hints_between_replicas").await {
        return;
    }
    // A subject prefix of its own, so parallel tests never hear each other.
    let prefix = format!("tollgate_test_{}", uuid::Uuid::new_v4().simple());
    let db = TestDb::sqlite("nats");
    let a = Notifier::nats(NATS_URL, &prefix).await.unwrap();
    let b = Notifier::nats(NATS_URL, &prefix).await.unwrap();
    assert_eq!(a.transport(), "nats");
    hints_cross_replicas(&db, a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_on_postgres_carries_hints_between_replicas() {
    if !nats_available("nats_on_postgres_carries_hints_between_replicas").await {
        return;
    }
    let Some(db) = TestDb::postgres("nats_on_postgres") else {
        return;
    };
    let prefix = format!("tollgate_test_{}", uuid::Uuid::new_v4().simple());
    let a = Notifier::nats(NATS_URL, &prefix).await.unwrap();
    let b = Notifier::nats(NATS_URL, &prefix).await.unwrap();
    hints_cross_replicas(&db, a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_listen_notify_carries_hints_between_replicas() {
    let Some(db) = TestDb::postgres("listen_notify") else {
        return;
    };
    let a = Notifier::postgres(&db.postgres_store().await)
        .await
        .unwrap();
    let b = Notifier::postgres(&db.postgres_store().await)
        .await
        .unwrap();
    assert_eq!(a.transport(), "postgres");
    hints_cross_replicas(&db, a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_other_schemas_do_not_hear_each_other() {
    let (Some(one), Some(two)) = (
        TestDb::postgres("schema_one"),
        TestDb::postgres("schema_two"),
    ) else {
        return;
    };
    let a = Notifier::postgres(&one.postgres_store().await)
        .await
        .unwrap();
    let b = Notifier::postgres(&two.postgres_store().await)
        .await
        .unwrap();
    let mut heard = b.subscribe();
    a.publish(Event::RunWoken {
        app: None,
        id: tollgate_core::RunId::generate(),
    });
    let got = tokio::time::timeout(Duration::from_millis(500), heard.recv()).await;
    assert!(got.is_err(), "another schema's event arrived: {got:?}");
}

/// An address that is not one is a clear error at start (an unreachable server is not:
/// see `nats_down_at_start_connects_in_the_background`).
#[tokio::test]
async fn an_invalid_nats_address_is_a_clear_error() {
    let err = Notifier::nats("nats://127.0.0.1:not-a-port", "tollgate")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("invalid NATS address"), "{err}");
}

/// A replica starts while NATS is down (the database is the truth, notifications are
/// hints), and hints flow once a NATS server comes up at that address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_down_at_start_connects_in_the_background() {
    let nats_bin = std::path::Path::new("/usr/sbin/nats-server");
    if !nats_bin.exists() {
        if std::env::var("TOLLGATE_REQUIRE_NATS").is_ok_and(|v| v == "1") {
            panic!("TOLLGATE_REQUIRE_NATS=1 but /usr/sbin/nats-server is missing");
        }
        eprintln!("skipping nats_down_at_start_connects_in_the_background: no nats-server");
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("nats://127.0.0.1:{port}");
    let prefix = format!("tollgate_test_{}", uuid::Uuid::new_v4().simple());
    let started = Instant::now();
    let early = tokio::time::timeout(Duration::from_secs(15), Notifier::nats(&url, &prefix))
        .await
        .expect("opening the notifier does not wait for NATS")
        .expect("NATS being down is not an error");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(early.transport(), "nats");
    // Publishing while disconnected neither fails nor blocks.
    early.publish(Event::RunWoken {
        app: None,
        id: tollgate_core::RunId::generate(),
    });

    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _nats = Kill(
        std::process::Command::new(nats_bin)
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("nats-server starts"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "nats-server never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let late = Notifier::nats(&url, &prefix).await.unwrap();
    // Each side hears the other once the early one has connected and subscribed.
    for (from, to) in [(&late, &early), (&early, &late)] {
        let mut heard = to.subscribe();
        let id = tollgate_core::RunId::generate();
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            assert!(
                Instant::now() < deadline,
                "the notifier that started without NATS never connected"
            );
            from.publish(Event::RunWoken { app: None, id });
            let got = tokio::time::timeout(Duration::from_millis(500), async {
                loop {
                    match heard.recv().await {
                        Ok(Event::RunWoken { id: woken, .. }) if woken == id => return true,
                        Ok(_) => {}
                        Err(_) => return false,
                    }
                }
            })
            .await;
            if got == Ok(true) {
                break;
            }
        }
    }
}
