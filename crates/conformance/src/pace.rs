//! docs/conformance.md#provider-pace provider pace: the call and token schedules every replica shares, and pauses.

use super::Backend;
use super::fixtures::*;
use std::num::NonZeroU32;
use std::time::Duration;
use tollgate_core::pace_cost_us;
use tollgate_store::PaceSlot;

fn per_minute(n: u32) -> i64 {
    pace_cost_us(
        1,
        NonZeroU32::new(n).expect("positive"),
        Duration::from_secs(60),
    )
}

fn calls(key: &str, per_min: u32) -> PaceSlot {
    PaceSlot {
        key: key.to_string(),
        request_cost_us: per_minute(per_min),
        token_cost_us: 0,
    }
}

/// docs/conformance.md#provider-pace: a provider paced at 6 calls a minute spaces calls 10 s apart, whichever
/// replica takes them; a call that has waited its turn starts at once.
pub async fn pace_spaces_calls_across_replicas(b: &dyn Backend) {
    let stores = open_stores(b, 2).await;
    let mut waits = Vec::new();
    for i in 0..4 {
        waits.push(
            stores[i % 2]
                .reserve_pace(&[calls("p", 6)])
                .await
                .expect("reserve_pace"),
        );
    }
    assert_eq!(
        waits,
        vec![secs(0), secs(10), secs(20), secs(30)],
        "6 a minute from two replicas: one call every 10 s"
    );
    b.clock().advance(secs(100));
    let later = stores[0]
        .reserve_pace(&[calls("p", 6)])
        .await
        .expect("reserve");
    assert_eq!(later, secs(0), "an idle schedule banks no burst beyond now");
    let next = stores[1]
        .reserve_pace(&[calls("p", 6)])
        .await
        .expect("reserve");
    assert_eq!(next, secs(10));
    // Another provider has its own schedule.
    let other = stores[1]
        .reserve_pace(&[calls("q", 6)])
        .await
        .expect("reserve");
    assert_eq!(other, secs(0));
}

/// docs/conformance.md#dispatch: a call waits for the later of its provider's and its model's schedules.
pub async fn a_call_waits_for_every_schedule_it_takes(b: &dyn Backend) {
    let s = b.open().await;
    let both = [calls("p", 60), calls("p/m", 6)];
    assert_eq!(s.reserve_pace(&both).await.expect("reserve"), secs(0));
    assert_eq!(s.reserve_pace(&both).await.expect("reserve"), secs(10));
    // Another model of the provider only waits for the provider's schedule.
    let other = [calls("p", 60), calls("p/n", 6)];
    let w = s.reserve_pace(&other).await.expect("reserve");
    assert!(
        w >= secs(10),
        "the provider's schedule moved on with the slower model: {w:?}"
    );
}

/// docs/conformance.md#provider-pace token pace: a call holds the token schedule for its bound; settling with
/// the real usage gives back what it did not use.
pub async fn token_pace_reserves_the_bound_and_settles_real_usage(b: &dyn Backend) {
    let s = b.open().await;
    let minute = Duration::from_secs(60);
    let tpm = NonZeroU32::new(1_000).expect("positive");
    let slot = |tokens: u64| PaceSlot {
        key: "p".into(),
        request_cost_us: 0,
        token_cost_us: pace_cost_us(tokens, tpm, minute),
    };
    assert_eq!(
        s.reserve_pace(&[slot(500)]).await.expect("reserve"),
        secs(0)
    );
    assert_eq!(
        s.reserve_pace(&[slot(500)]).await.expect("reserve"),
        secs(30),
        "500 of 1,000 tokens a minute: the next call waits half a minute"
    );
    // The second call used 100 tokens, not 500: 400 tokens (24 s) come back.
    s.settle_pace("p", -pace_cost_us(400, tpm, minute))
        .await
        .expect("settle");
    assert_eq!(
        s.reserve_pace(&[slot(100)]).await.expect("reserve"),
        secs(36)
    );
}

/// docs/conformance.md#provider-pace: a 429 with Retry-After pauses the provider on every replica until then; a
/// shorter later pause never shortens it.
pub async fn a_pause_holds_every_replica_until_it_ends(b: &dyn Backend) {
    let stores = open_stores(b, 2).await;
    let keys = vec!["p".to_string()];
    assert_eq!(
        stores[0].pace_pause_left(&keys).await.expect("pause_left"),
        Duration::ZERO
    );
    stores[0].pause_pace("p", secs(30)).await.expect("pause");
    stores[1].pause_pace("p", secs(5)).await.expect("pause");
    assert_eq!(
        stores[1].pace_pause_left(&keys).await.expect("pause_left"),
        secs(30)
    );
    assert_eq!(
        stores[1]
            .reserve_pace(&[calls("p", 60)])
            .await
            .expect("reserve"),
        secs(30),
        "no call starts before the pause ends, on any replica"
    );
    b.clock().advance(secs(31));
    assert_eq!(
        stores[0].pace_pause_left(&keys).await.expect("pause_left"),
        Duration::ZERO
    );
}

/// docs/routes.md: cooldowns are pauses on `cooldown:<deployment>` schedules, read for all
/// of a route's deployments at once, in order, on every replica; an unknown key has none.
pub async fn cooldowns_are_read_per_deployment_on_every_replica(b: &dyn Backend) {
    let stores = open_stores(b, 2).await;
    let keys: Vec<String> = ["cooldown:a/x", "cooldown:b/y", "cooldown:c/z"]
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        stores[1]
            .pace_pauses_left(&keys)
            .await
            .expect("pauses_left"),
        vec![Duration::ZERO; 3]
    );
    stores[0]
        .pause_pace("cooldown:b/y", secs(30))
        .await
        .expect("pause");
    stores[0]
        .pause_pace("cooldown:c/z", secs(10))
        .await
        .expect("pause");
    assert_eq!(
        stores[1]
            .pace_pauses_left(&keys)
            .await
            .expect("pauses_left"),
        vec![Duration::ZERO, secs(30), secs(10)]
    );
    assert!(
        stores[1]
            .pace_pauses_left(&[])
            .await
            .expect("pauses_left")
            .is_empty()
    );
    b.clock().advance(secs(11));
    assert_eq!(
        stores[0]
            .pace_pauses_left(&keys)
            .await
            .expect("pauses_left"),
        vec![Duration::ZERO, secs(19), Duration::ZERO]
    );
}
