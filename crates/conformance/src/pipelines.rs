//! Pipelines in the store: definitions by content version, pipeline runs, and driver
//! leases that keep replicas from driving one run at once.

use super::Backend;
use super::fixtures::*;
use serde_json::json;
use std::time::Duration;
use tollgate_core::{EffectKey, PipelineName, RunState};
use tollgate_store::{PipelineRef, RunResult, WaitOutcome};

fn name(n: &str) -> PipelineName {
    PipelineName::new(n).expect("valid pipeline name")
}

/// Registering a version twice answers the stored one; the newest version is the
/// default; another app sees none of it.
pub async fn pipelines_are_versioned_per_app(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let def1 = json!({"steps": [1]});
    let def2 = json!({"steps": [2]});
    let (p1, created) = s
        .put_pipeline(&acme, &name("invoice"), "v-one", &def1)
        .await
        .unwrap();
    assert!(created);
    assert_eq!(p1.definition, def1);
    let (again, created) = s
        .put_pipeline(&acme, &name("invoice"), "v-one", &def1)
        .await
        .unwrap();
    assert!(!created, "the same version is registered once");
    assert_eq!(again.created_at, p1.created_at);
    b.clock().advance(secs(1));
    s.put_pipeline(&acme, &name("invoice"), "v-two", &def2)
        .await
        .unwrap();
    let latest = s
        .get_pipeline(&acme, &name("invoice"), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(latest.version, "v-two", "the newest version is the default");
    let pinned = s
        .get_pipeline(&acme, &name("invoice"), Some("v-one"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(pinned.definition, def1);
    assert!(
        s.get_pipeline(&app("beta"), &name("invoice"), None)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        s.get_pipeline(&acme, &name("nope"), None)
            .await
            .unwrap()
            .is_none()
    );
}

/// A pipeline run is driven by one driver at a time; its lease expires; a waiting run is
/// not driven until woken; a finished or canceled run is never driven again.
pub async fn pipeline_runs_are_driven_by_one_driver_at_a_time(b: &dyn Backend) {
    let s = b.open().await;
    let other = b.open().await;
    let acme = app("acme");
    s.put_pipeline(&acme, &name("p"), "v1", &json!({}))
        .await
        .unwrap();
    let pref = PipelineRef {
        name: name("p"),
        version: "v1".into(),
    };
    let run = s
        .create_pipeline_run(new_run("acme", "s"), &pref)
        .await
        .unwrap();
    assert_eq!(
        s.run_pipeline(&acme, run.id).await.unwrap(),
        Some(pref.clone())
    );
    assert_eq!(s.run_pipeline(&app("beta"), run.id).await.unwrap(), None);
    let plain = create_run(&*s, new_run("acme", "s")).await;
    assert_eq!(s.run_pipeline(&acme, plain.id).await.unwrap(), None);

    let d1 = worker("d1");
    let d2 = worker("d2");
    let lease = Duration::from_secs(30);
    let claimed = s.claim_pipeline_runs(&d1, lease, 10).await.unwrap();
    assert_eq!(
        claimed.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![run.id],
        "plain runs are not driven"
    );
    assert!(
        other
            .claim_pipeline_runs(&d2, lease, 10)
            .await
            .unwrap()
            .is_empty(),
        "held by d1"
    );
    // The lease ends: another driver may take over (d1 crashed).
    b.clock().advance(secs(31));
    assert_eq!(
        other
            .claim_pipeline_runs(&d2, lease, 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(
        !s.release_pipeline_run(run.id, &d1, None).await.unwrap(),
        "d1 no longer holds it"
    );
    // A run waiting on its task is not driven until woken.
    let t = create_new(&*s, new_run_task("acme", run.id, "step-a")).await;
    assert!(matches!(
        s.wait_on_task(&acme, run.id, t.id).await.unwrap(),
        WaitOutcome::Waiting(_)
    ));
    assert!(other.release_pipeline_run(run.id, &d2, None).await.unwrap());
    assert!(
        s.claim_pipeline_runs(&d1, lease, 10)
            .await
            .unwrap()
            .is_empty(),
        "waiting"
    );
    let w = worker("w");
    claim(&*s, t.id, &w).await;
    assert!(complete(&*s, t.id, &w, spam()).await.applied);
    assert_eq!(
        s.claim_pipeline_runs(&d1, lease, 10).await.unwrap().len(),
        1,
        "woken"
    );
    assert_eq!(
        s.run_tasks(&acme, run.id)
            .await
            .unwrap()
            .iter()
            .map(|t| t.id)
            .collect::<Vec<_>>(),
        vec![t.id]
    );
    assert!(s.run_tasks(&app("beta"), run.id).await.unwrap().is_empty());
    // Deferred: due again only at wake_at.
    let later = tollgate_core::Clock::now(b.clock()).plus(secs(10));
    assert!(
        s.release_pipeline_run(run.id, &d1, Some(later))
            .await
            .unwrap()
    );
    assert!(
        s.claim_pipeline_runs(&d1, lease, 10)
            .await
            .unwrap()
            .is_empty(),
        "not due yet"
    );
    b.clock().advance(secs(10));
    assert_eq!(
        s.claim_pipeline_runs(&d1, lease, 10).await.unwrap().len(),
        1,
        "due"
    );
    // Finished: never driven again.
    s.finish_run(&acme, run.id, RunResult::Succeeded(json!({"ok": true})))
        .await
        .unwrap();
    assert!(s.release_pipeline_run(run.id, &d1, None).await.unwrap());
    assert!(
        s.claim_pipeline_runs(&d1, lease, 10)
            .await
            .unwrap()
            .is_empty()
    );
    // Canceled: never driven again.
    let run2 = s
        .create_pipeline_run(new_run("acme", "s"), &pref)
        .await
        .unwrap();
    s.request_run_cancel(&acme, run2.id).await.unwrap();
    assert_eq!(get_run(&*s, &acme, run2.id).await.state, RunState::Canceled);
    assert!(
        s.claim_pipeline_runs(&d1, lease, 10)
            .await
            .unwrap()
            .is_empty()
    );
    // An unregistered version cannot be run.
    let missing = PipelineRef {
        name: name("p"),
        version: "nope".into(),
    };
    assert!(
        s.create_pipeline_run(new_run("acme", "s"), &missing)
            .await
            .is_err()
    );
}

/// Racing drivers on several store instances claim each due run exactly once.
pub async fn racing_drivers_claim_each_run_once(b: &dyn Backend) {
    let stores = open_stores(b, 4).await;
    let acme = app("acme");
    stores[0]
        .put_pipeline(&acme, &name("p"), "v1", &json!({}))
        .await
        .unwrap();
    let pref = PipelineRef {
        name: name("p"),
        version: "v1".into(),
    };
    let mut ids = Vec::new();
    for _ in 0..40 {
        ids.push(
            stores[0]
                .create_pipeline_run(new_run("acme", "s"), &pref)
                .await
                .unwrap()
                .id,
        );
    }
    let mut handles = Vec::new();
    for i in 0..8 {
        let s = stores[i % stores.len()].clone();
        handles.push(tokio::spawn(async move {
            let d = worker(&format!("driver-{i}"));
            let mut mine = Vec::new();
            for _ in 0..10 {
                let got = s
                    .claim_pipeline_runs(&d, Duration::from_secs(60), 3)
                    .await
                    .expect("claim");
                mine.extend(got.into_iter().map(|r| r.id));
            }
            mine
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.expect("driver task"));
    }
    let mut sorted = all.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), all.len(), "no run was claimed twice");
    ids.sort();
    assert_eq!(sorted, ids, "every due run was claimed");
}

/// A run started under a key is started once per app: the same key answers the same run
/// (`false`), even from racing replicas; another app's key of the same text is its own;
/// starts without a key are never merged.
pub async fn pipeline_runs_start_once_per_key(b: &dyn Backend) {
    let stores = open_stores(b, 4).await;
    let s = &stores[0];
    for a in ["acme", "beta"] {
        s.put_pipeline(&app(a), &name("p"), "v1", &json!({}))
            .await
            .unwrap();
    }
    let pref = PipelineRef {
        name: name("p"),
        version: "v1".into(),
    };
    let start_key = EffectKey::new("start-1").unwrap();
    let (first, created) = s
        .start_pipeline_run_once(new_run("acme", "s"), &pref, &start_key)
        .await
        .unwrap();
    assert!(created);
    assert_eq!(first.state, RunState::Running);
    let (again, created) = s
        .start_pipeline_run_once(new_run("acme", "other-scope"), &pref, &start_key)
        .await
        .unwrap();
    assert!(!created);
    assert_eq!(again.id, first.id);
    assert_eq!(
        again.scope, first.scope,
        "the existing run, as it was started"
    );
    let (theirs, created) = s
        .start_pipeline_run_once(new_run("beta", "s"), &pref, &start_key)
        .await
        .unwrap();
    assert!(created, "keys are per app");
    assert_ne!(theirs.id, first.id);
    let unkeyed = s
        .create_pipeline_run(new_run("acme", "s"), &pref)
        .await
        .unwrap();
    assert_ne!(unkeyed.id, first.id);
    // An unregistered version is refused and takes no key.
    let missing = PipelineRef {
        name: name("p"),
        version: "nope".into(),
    };
    let other_key = EffectKey::new("start-2").unwrap();
    assert!(
        s.start_pipeline_run_once(new_run("acme", "s"), &missing, &other_key)
            .await
            .is_err()
    );

    // Racing replicas: one run per key.
    let race_key = EffectKey::new("race").unwrap();
    let mut handles = Vec::new();
    for i in 0..8 {
        let s = stores[i % stores.len()].clone();
        let pref = pref.clone();
        let race_key = race_key.clone();
        handles.push(tokio::spawn(async move {
            s.start_pipeline_run_once(new_run("acme", "s"), &pref, &race_key)
                .await
                .expect("start")
        }));
    }
    let mut ids = Vec::new();
    let mut created = 0;
    for h in handles {
        let (run, c) = h.await.expect("start task");
        ids.push(run.id);
        created += usize::from(c);
    }
    assert_eq!(created, 1, "exactly one start created the run");
    ids.dedup();
    assert_eq!(ids.len(), 1, "every start answered the same run");
}
