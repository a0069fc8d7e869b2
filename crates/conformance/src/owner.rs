//! docs/conformance.md#application-tasks: application-owned tasks: release, unreleased sources, owner deletion.

use super::Backend;
use super::fixtures::*;
use tollgate_core::{Clock, ErrorCode, NewTask};
use tollgate_store::{MAX_PAGE, ScopedSource, UnreleasedQuery};

/// docs/conformance.md#application-tasks release: by (app, scope, effect key) of an application-owned task; answers
/// whether a task matched. Another scope, another app, an unknown key or a run-owned task
/// match nothing.
pub async fn release_matches_only_application_tasks_of_the_scope(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let t = create_new(&*s, new_app_task("acme", "s", "k")).await;
    let run = create_run(&*s, new_run("acme", "s")).await;
    let run_task = create_new(&*s, new_run_task("acme", run.id, "run-task")).await;
    assert!(
        !s.release(&acme, &scope("other"), &key("k"))
            .await
            .expect("release"),
        "another scope"
    );
    assert!(
        !s.release(&app("globex"), &scope("s"), &key("k"))
            .await
            .expect("release"),
        "another app"
    );
    assert!(
        !s.release(&acme, &scope("s"), &key("nope"))
            .await
            .expect("release"),
        "an unknown key"
    );
    assert!(
        !s.release(&acme, &scope("s"), &key("run-task"))
            .await
            .expect("release"),
        "a run-owned task"
    );
    assert_eq!(get(&*s, &acme, t.id).await.released_at, None);
    assert_eq!(get(&*s, &acme, run_task.id).await.released_at, None);

    b.clock().advance(secs(7));
    assert!(
        s.release(&acme, &scope("s"), &key("k"))
            .await
            .expect("release")
    );
    assert_eq!(
        get(&*s, &acme, t.id).await.released_at,
        Some(b.clock().now())
    );
}

/// docs/conformance.md#application-tasks: a task created `released` (the OpenAI door's)
/// is released by the write that creates it (`released_at` = `created_at`) on every
/// creation path — alone unscoped, alone admitted under a reservation, in a batch — and a
/// replay of its key changes nothing; a task created without it stays unreleased.
pub async fn a_task_created_released_is_released_by_its_creation(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let released = |mut t: NewTask| {
        t.released = true;
        t
    };
    let alone = create_new(&*s, released(new_app_task("acme", "s", "alone"))).await;
    let reserved = super::unsourced::unsourced_task(
        "acme",
        "s",
        "reserved",
        unlimited(),
        tollgate_core::Reservation {
            nano_usd: 1_000,
            tokens: 10,
            ..Default::default()
        },
    );
    let reserved = create_new(&*s, released(reserved)).await;
    let batch = s
        .create_tasks(vec![
            released(with_input(new_app_task("acme", "s", "batch-1"), "one")),
            with_input(new_app_task("acme", "s", "batch-2"), "two"),
        ])
        .await
        .expect("create_tasks");
    let batch: Vec<_> = batch
        .into_iter()
        .map(|c| c.expect("created").task)
        .collect();
    for t in [&alone, &reserved, &batch[0]] {
        assert_eq!(t.released_at, Some(t.created_at), "{}", t.effect_key);
        let stored = get(&*s, &acme, t.id).await;
        assert_eq!(stored.released_at, Some(t.created_at), "{}", t.effect_key);
    }
    assert_eq!(batch[1].released_at, None, "created without `released`");
    assert_eq!(get(&*s, &acme, batch[1].id).await.released_at, None);

    b.clock().advance(secs(7));
    let replay = s
        .create_task(released(new_app_task("acme", "s", "alone")))
        .await
        .expect("replay");
    assert!(!replay.created);
    assert_eq!(replay.task.id, alone.id);
    assert_eq!(replay.task.released_at, Some(alone.created_at));
    // Released already: a later release keeps the first time.
    assert!(
        s.release(&acme, &scope("s"), &key("alone"))
            .await
            .expect("release")
    );
    assert_eq!(
        get(&*s, &acme, alone.id).await.released_at,
        Some(alone.created_at)
    );
}

/// docs/conformance.md#application-tasks list unreleased sources: the distinct (scope, source) pairs that still have
/// unreleased application tasks, ordered by (scope, source), in pages of at most 100 with
/// a keyset cursor; optionally for one step key or one scope. Released, unscoped, run-owned
/// and other apps' tasks do not count.
pub async fn unreleased_sources_page_with_a_keyset_cursor(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let mut main_step = Vec::new();
    let mut n = 0;
    let mut next_key = || {
        n += 1;
        format!("k{n}")
    };
    for sc in ["scope1", "scope2", "scope3"] {
        for i in 0..45 {
            let src = format!("src{i:03}");
            create_new(
                &*s,
                new_scoped_task("acme", sc, &next_key(), &src, unlimited()),
            )
            .await;
            main_step.push(ScopedSource {
                scope: scope(sc),
                source: source(&src),
            });
        }
    }
    // A second task of a listed pair, still one pair.
    create_new(
        &*s,
        with_input(
            new_scoped_task("acme", "scope1", &next_key(), "src000", unlimited()),
            "again",
        ),
    )
    .await;
    // Pairs with tasks of another step only.
    let mut other_step = Vec::new();
    for i in 900..905 {
        let src = format!("src{i}");
        let t = NewTask {
            dispatch: tollgate_core::Dispatch::default(),
            step: step("other"),
            ..new_scoped_task("acme", "scope2", &next_key(), &src, unlimited())
        };
        create_new(&*s, t).await;
        other_step.push(ScopedSource {
            scope: scope("scope2"),
            source: source(&src),
        });
    }
    // Not listed: released, unscoped, run-owned, other app.
    let released_key = next_key();
    create_new(
        &*s,
        new_scoped_task("acme", "scope1", &released_key, "src950", unlimited()),
    )
    .await;
    assert!(
        s.release(&acme, &scope("scope1"), &key(&released_key))
            .await
            .expect("release")
    );
    create_new(&*s, new_app_task("acme", "scope1", &next_key())).await;
    let run = create_run(&*s, new_run("acme", "scope1")).await;
    create_new(
        &*s,
        NewTask {
            dispatch: tollgate_core::Dispatch::default(),
            scope: scoped("src960", unlimited()),
            ..new_run_task("acme", run.id, &next_key())
        },
    )
    .await;
    create_new(
        &*s,
        new_scoped_task("globex", "scope1", "g1", "src970", unlimited()),
    )
    .await;

    let mut everything: Vec<ScopedSource> =
        main_step.iter().chain(other_step.iter()).cloned().collect();
    everything.sort();
    main_step.sort();

    let pages = collect_pages(&*s, &acme, UnreleasedQuery::default()).await;
    assert_eq!(pages[0].len(), MAX_PAGE as usize, "a page holds 100 pairs");
    assert_eq!(
        pages.concat(),
        everything,
        "every unreleased pair once, in (scope, source) order"
    );

    let by_step = UnreleasedQuery {
        step: Some(step("label-email")),
        limit: 30,
        ..Default::default()
    };
    let pages = collect_pages(&*s, &acme, by_step).await;
    assert!(pages.iter().all(|p| p.len() <= 30), "the limit is honoured");
    assert_eq!(
        pages.concat(),
        main_step,
        "the step filter keeps only that step's pairs"
    );

    let one_scope = UnreleasedQuery {
        scope: Some(scope("scope2")),
        limit: 500,
        ..Default::default()
    };
    let pages = collect_pages(&*s, &acme, one_scope).await;
    let expected: Vec<ScopedSource> = everything
        .iter()
        .filter(|p| p.scope == scope("scope2"))
        .cloned()
        .collect();
    assert_eq!(
        pages.concat(),
        expected,
        "the scope filter keeps only that scope"
    );

    // Releasing every task of a pair removes it.
    assert!(
        s.release(&acme, &scope("scope3"), &key("k91"))
            .await
            .expect("release")
    );
    let pages = collect_pages(
        &*s,
        &acme,
        UnreleasedQuery {
            scope: Some(scope("scope3")),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        pages.concat().len(),
        44,
        "scope3's first source was released"
    );
    assert!(!pages.concat().contains(&ScopedSource {
        scope: scope("scope3"),
        source: source("src000")
    }));
}

/// Keyset paging says "more" only when there is more: with exactly two full pages of
/// pairs, the second page has no `next` (each page reads one row beyond its size to know),
/// and a page size of exactly the row count answers one page without `next`. A subject
/// filter lists only the pairs with tasks done for that subject.
pub async fn unreleased_sources_last_full_page_has_no_next(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let news: Vec<NewTask> = (0..2 * MAX_PAGE)
        .map(|i| {
            let t = new_scoped_task(
                "acme",
                "s",
                &format!("k{i}"),
                &format!("src{i:03}"),
                unlimited(),
            );
            with_subject(t, i.is_multiple_of(2).then(|| user("alice")))
        })
        .collect();
    for t in news {
        create_new(&*s, t).await;
    }
    let first = s
        .list_unreleased_sources(&acme, &UnreleasedQuery::default())
        .await
        .expect("page 1");
    assert_eq!(first.sources.len(), MAX_PAGE as usize);
    let cursor = first.next.clone().expect("a second page follows");
    assert_eq!(Some(&cursor), first.sources.last());
    let second = s
        .list_unreleased_sources(
            &acme,
            &UnreleasedQuery {
                after: Some(cursor),
                ..Default::default()
            },
        )
        .await
        .expect("page 2");
    assert_eq!(second.sources.len(), MAX_PAGE as usize);
    assert_eq!(second.next, None, "the last page has no next");
    let exact = s
        .list_unreleased_sources(
            &acme,
            &UnreleasedQuery {
                scope: Some(scope("s")),
                step: None,
                after: Some(second.sources[MAX_PAGE as usize - 31].clone()),
                limit: 30,
                subject: None,
            },
        )
        .await
        .expect("a page of exactly the rest");
    assert_eq!((exact.sources.len(), exact.next), (30, None));
    let alice = s
        .list_unreleased_sources(
            &acme,
            &UnreleasedQuery {
                subject: Some(user("alice")),
                ..Default::default()
            },
        )
        .await
        .expect("alice's pairs");
    assert_eq!((alice.sources.len(), alice.next), (MAX_PAGE as usize, None));
    assert!(
        alice.sources.iter().all(|p| {
            let n: u32 = p.source.as_str()[3..].parse().unwrap();
            n.is_multiple_of(2)
        }),
        "only pairs with alice's tasks"
    );
}

async fn collect_pages(
    s: &dyn tollgate_store::Store,
    app_id: &tollgate_core::AppId,
    mut query: UnreleasedQuery,
) -> Vec<Vec<ScopedSource>> {
    let mut pages = Vec::new();
    for _ in 0..50 {
        let page = s
            .list_unreleased_sources(app_id, &query)
            .await
            .expect("list_unreleased_sources");
        assert!(
            page.sources.len() <= MAX_PAGE as usize,
            "a page holds at most 100 pairs"
        );
        if let (Some(last), Some(next)) = (page.sources.last(), page.next.as_ref()) {
            assert_eq!(last, next, "the cursor is the page's last pair");
        }
        let next = page.next.clone();
        if !page.sources.is_empty() {
            pages.push(page.sources);
        }
        match next {
            Some(cursor) => query.after = Some(cursor),
            None => return pages,
        }
    }
    panic!("list_unreleased_sources did not finish within 50 pages");
}

/// docs/conformance.md#application-tasks delete owner data: deletes the app's application-owned tasks of the scope
/// (optionally of one source) and returns how many; run-owned tasks, other scopes and
/// other apps are untouched.
pub async fn delete_owner_data_deletes_only_that_scope_and_source(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let a1 = create_new(
        &*s,
        new_scoped_task("acme", "s", "a1", "doc-1", unlimited()),
    )
    .await;
    let a2 = create_new(
        &*s,
        with_input(
            new_scoped_task("acme", "s", "a2", "doc-1", unlimited()),
            "again",
        ),
    )
    .await;
    succeed(&*s, a2.id).await;
    let b1 = create_new(
        &*s,
        new_scoped_task("acme", "s", "b1", "doc-2", unlimited()),
    )
    .await;
    let unscoped = create_new(&*s, new_app_task("acme", "s", "unscoped")).await;
    let run = create_run(&*s, new_run("acme", "s")).await;
    let run_task = create_new(
        &*s,
        NewTask {
            dispatch: tollgate_core::Dispatch::default(),
            scope: scoped("doc-1", unlimited()),
            ..new_run_task("acme", run.id, "run-task")
        },
    )
    .await;
    let other_scope = create_new(
        &*s,
        new_scoped_task("acme", "t", "other-scope", "doc-1", unlimited()),
    )
    .await;
    let other_app = create_new(
        &*s,
        new_scoped_task("globex", "s", "other-app", "doc-1", unlimited()),
    )
    .await;

    let n = s
        .delete_owner_data(&acme, &scope("s"), Some(&source("doc-1")))
        .await
        .expect("delete_owner_data");
    assert_eq!(n, 2, "both application tasks of doc-1");
    assert_eq!(try_get(&*s, &acme, a1.id).await, None);
    assert_eq!(try_get(&*s, &acme, a2.id).await, None);
    assert_eq!(get_by_key(&*s, &acme, "a1").await, None);
    for id in [b1.id, unscoped.id, run_task.id, other_scope.id] {
        assert!(
            try_get(&*s, &acme, id).await.is_some(),
            "task {id} is not that source's"
        );
    }
    let n = s
        .delete_owner_data(&acme, &scope("s"), None)
        .await
        .expect("delete_owner_data");
    assert_eq!(
        n, 2,
        "the rest of the scope's application tasks, unscoped ones included"
    );
    assert_eq!(try_get(&*s, &acme, b1.id).await, None);
    assert_eq!(try_get(&*s, &acme, unscoped.id).await, None);
    assert!(
        try_get(&*s, &acme, run_task.id).await.is_some(),
        "run-owned tasks are not the application's"
    );
    assert!(
        try_get(&*s, &acme, other_scope.id).await.is_some(),
        "another scope is untouched"
    );
    assert!(
        try_get(&*s, &app("globex"), other_app.id).await.is_some(),
        "another app is untouched"
    );
    assert_eq!(
        s.delete_owner_data(&acme, &scope("s"), None)
            .await
            .expect("delete_owner_data"),
        0
    );
}

/// docs/conformance.md#admission, docs/conformance.md#application-tasks: deleting an owner's data keeps admission records: the scope's steps,
/// sources and token bucket stay spent.
pub async fn delete_owner_data_keeps_admission_records(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let limits = budget(1, 1, 100, 100, 2, 1);
    let t = create_new(&*s, new_scoped_task("acme", "s", "k1", "doc", limits)).await;
    succeed(&*s, t.id).await;
    assert_eq!(
        s.delete_owner_data(&acme, &scope("s"), None)
            .await
            .expect("delete_owner_data"),
        1
    );

    let r = rejection(&*s, new_scoped_task("acme", "s", "k2", "doc-2", limits)).await;
    assert_eq!(
        r.code(),
        ErrorCode::DailyBudget,
        "the deleted scope's daily budget is still spent"
    );
    let r = rejection(
        &*s,
        with_input(
            new_scoped_task("acme", "s", "k3", "doc", limits),
            "another step",
        ),
    )
    .await;
    assert_eq!(
        r.code(),
        ErrorCode::SourceBudget,
        "the deleted source's steps are still spent"
    );
    // The same step again is allowed (and no longer cached): it takes the second token...
    let again = create_new(&*s, new_scoped_task("acme", "s", "k4", "doc", limits)).await;
    assert_eq!(
        again.cached_from, None,
        "deleted results are not served from the cache"
    );
    // ...and the bucket was not refilled by the deletion.
    let r = rejection(&*s, new_scoped_task("acme", "s", "k5", "doc", limits)).await;
    assert_eq!(
        r.code(),
        ErrorCode::RateLimit,
        "deletion does not reset the rate limit"
    );
}

/// docs/conformance.md#lifecycle, docs/conformance.md#application-tasks: a running task whose owner was deleted sees cancellation, must stop, and
/// cannot complete or fail.
pub async fn deleted_in_flight_task_sees_cancellation_and_cannot_complete(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let w = worker("w");
    let t = create_new(&*s, new_scoped_task("acme", "s", "k", "doc", unlimited())).await;
    claim(&*s, t.id, &w).await;
    assert!(!cancel_requested(&*s, t.id).await);
    assert_eq!(
        s.delete_owner_data(&acme, &scope("s"), None)
            .await
            .expect("delete_owner_data"),
        1
    );

    assert!(
        cancel_requested(&*s, t.id).await,
        "the worker sees cancellation"
    );
    let report = s.heartbeat(&w, &[(t.id, 1)]).await.expect("heartbeat");
    assert_eq!(
        (report.alive, report.stop),
        (vec![], vec![(t.id, 1)]),
        "the worker is told to stop"
    );
    let tr = s
        .complete_task(t.id, &lease(&w, 1), spam(), usage())
        .await
        .expect("complete_task");
    assert!(
        !tr.applied && tr.task.is_none(),
        "a deleted task cannot complete: {tr:?}"
    );
    let tr = fail(&*s, t.id, "late").await;
    assert!(
        !tr.applied && tr.task.is_none(),
        "a deleted task cannot fail: {tr:?}"
    );
    assert_eq!(try_get(&*s, &acme, t.id).await, None);
    assert_eq!(get_by_key(&*s, &acme, "k").await, None);
    assert_eq!(s.first_queued().await.expect("first_queued"), None);
}
