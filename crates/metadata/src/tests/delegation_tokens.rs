//! Delegation tokens in the controller: lifetimes, renewals, expiry, the sweep, and the
//! tokens surviving replay and snapshots.

use rill_protocol::ErrorCode;

use super::Harness;
use crate::delegation_tokens::*;
use crate::*;

const HOUR: i64 = 3_600_000;

fn harness() -> Harness {
    Harness::with_config(ControllerConfig {
        delegation_tokens: DelegationTokenConfig {
            enabled: true,
            max_lifetime_ms: 48 * HOUR,
            expiry_time_ms: 10 * HOUR,
            expiry_check_interval_ms: HOUR,
        },
        // Only the sweep's deadline, so that the test can read it.
        auto_leader_rebalance_enable: false,
        ..Default::default()
    })
}

fn create(
    h: &mut Harness,
    id: &str,
    owner: &str,
    renewers: &[&str],
    max_lifetime_ms: i64,
) -> CreateDelegationTokenResponse {
    let r = h.run(ControllerEvent::CreateDelegationToken(
        CreateDelegationTokenRequest {
            token_id: id.into(),
            owner: owner.into(),
            requester: owner.into(),
            renewers: renewers.iter().map(|r| r.to_string()).collect(),
            max_lifetime_ms,
        },
    ));
    let ControllerResponse::CreateDelegationToken(resp) = r.response else {
        panic!("{r:?}")
    };
    resp
}

fn change(
    h: &mut Harness,
    renew: bool,
    id: &str,
    principal: &str,
    period_ms: i64,
) -> DelegationTokenExpiryResponse {
    let req = ChangeDelegationTokenRequest {
        token_id: id.into(),
        principal: principal.into(),
        period_ms,
    };
    let r = h.run(if renew {
        ControllerEvent::RenewDelegationToken(req)
    } else {
        ControllerEvent::ExpireDelegationToken(req)
    });
    let ControllerResponse::ChangeDelegationToken(resp) = r.response else {
        panic!("{r:?}")
    };
    resp
}

#[test]
fn a_token_gets_its_lifetimes_and_is_in_the_image() {
    let mut h = harness();
    h.now = 1_000;
    let r = create(&mut h, "t1", "User:alice", &["User:bob"], -1);
    assert_eq!(r.error_code, ErrorCode::NONE);
    assert_eq!(r.issue_timestamp_ms, 1_000);
    assert_eq!(r.max_timestamp_ms, 1_000 + 48 * HOUR);
    assert_eq!(r.expiry_timestamp_ms, 1_000 + 10 * HOUR);
    let t = &h.image.delegation_tokens["t1"];
    assert_eq!(t.owner, "User:alice");
    assert_eq!(t.renewers, vec!["User:bob".to_string()]);
    // A shorter maximum asked for wins, and bounds the first expiry too.
    let r = create(&mut h, "t2", "User:alice", &[], 2 * HOUR);
    assert_eq!(r.max_timestamp_ms, 1_000 + 2 * HOUR);
    assert_eq!(r.expiry_timestamp_ms, 1_000 + 2 * HOUR);
    // A longer one does not.
    let r = create(&mut h, "t3", "User:alice", &[], 100 * HOUR);
    assert_eq!(r.max_timestamp_ms, 1_000 + 48 * HOUR);
    // An id in use is refused (the broker draws another), as is a renewer that is no user.
    assert_eq!(
        create(&mut h, "t1", "User:carol", &[], -1).error_code,
        ErrorCode::DUPLICATE_RESOURCE
    );
    assert_eq!(
        create(&mut h, "t4", "User:carol", &["Group:ops"], -1).error_code,
        ErrorCode::INVALID_PRINCIPAL_TYPE
    );
    assert_eq!(h.image.delegation_tokens.len(), 3);
    h.check_replay();
    let snapshot = MetadataImage::from_snapshot(h.image.to_snapshot().unwrap()).unwrap();
    assert_eq!(snapshot.delegation_tokens, h.image.delegation_tokens);
}

#[test]
fn renewal_is_for_the_owner_and_renewers_and_stops_at_the_maximum() {
    let mut h = harness();
    create(&mut h, "t", "User:alice", &["User:bob"], -1);
    h.now = 5 * HOUR;
    let r = change(&mut h, true, "t", "User:mallory", -1);
    assert_eq!(r.error_code, ErrorCode::DELEGATION_TOKEN_OWNER_MISMATCH);
    let r = change(&mut h, true, "t", "User:bob", -1);
    assert_eq!(r.error_code, ErrorCode::NONE);
    assert_eq!(r.expiry_timestamp_ms, 15 * HOUR);
    // A shorter period asked for wins.
    let r = change(&mut h, true, "t", "User:alice", HOUR);
    assert_eq!(r.expiry_timestamp_ms, 6 * HOUR);
    assert_eq!(h.image.delegation_tokens["t"].expiry_timestamp_ms, 6 * HOUR);
    // Near the end of its life the expiry stops at the maximum.
    h.now = 45 * HOUR;
    let r = change(&mut h, true, "t", "User:alice", -1);
    assert_eq!(
        r.error_code,
        ErrorCode::DELEGATION_TOKEN_EXPIRED,
        "it expired at 6h"
    );
    assert_eq!(
        change(&mut h, true, "nope", "User:alice", -1).error_code,
        ErrorCode::DELEGATION_TOKEN_NOT_FOUND
    );
    let mut h = harness();
    create(&mut h, "t", "User:alice", &[], -1);
    for hour in (9..48).step_by(9) {
        h.now = hour * HOUR;
        assert_eq!(
            change(&mut h, true, "t", "User:alice", -1).error_code,
            ErrorCode::NONE
        );
    }
    h.now = 46 * HOUR;
    let r = change(&mut h, true, "t", "User:alice", -1);
    assert_eq!(r.expiry_timestamp_ms, 48 * HOUR);
    h.check_replay();
}

#[test]
fn expiry_now_removes_the_token_and_a_period_moves_its_expiry() {
    let mut h = harness();
    create(&mut h, "t", "User:alice", &["User:bob"], -1);
    h.now = HOUR;
    let r = change(&mut h, false, "t", "User:mallory", -1);
    assert_eq!(r.error_code, ErrorCode::DELEGATION_TOKEN_OWNER_MISMATCH);
    assert!(h.image.delegation_tokens.contains_key("t"));
    let r = change(&mut h, false, "t", "User:bob", 30 * 60_000);
    assert_eq!(r.error_code, ErrorCode::NONE);
    assert_eq!(r.expiry_timestamp_ms, HOUR + 30 * 60_000);
    let r = change(&mut h, false, "t", "User:alice", -1);
    assert_eq!(
        (r.error_code, r.expiry_timestamp_ms),
        (ErrorCode::NONE, HOUR)
    );
    assert!(!h.image.delegation_tokens.contains_key("t"));
    assert_eq!(
        change(&mut h, false, "t", "User:alice", -1).error_code,
        ErrorCode::DELEGATION_TOKEN_NOT_FOUND
    );
    h.check_replay();
}

#[test]
fn the_sweep_removes_expired_tokens_at_its_interval() {
    let mut h = harness();
    h.tick();
    create(&mut h, "short", "User:alice", &[], 2 * HOUR);
    create(&mut h, "long", "User:alice", &[], -1);
    assert_eq!(h.controller.next_deadline(&h.image), Some(HOUR));
    h.now = HOUR;
    h.tick();
    assert_eq!(h.image.delegation_tokens.len(), 2);
    // At 3h the short one has passed its maximum; the sweep at its interval removes it.
    h.now = 3 * HOUR;
    assert!(h
        .tick()
        .records
        .iter()
        .any(|r| matches!(r, MetadataRecord::RemoveDelegationToken(t) if t.token_id == "short")));
    assert_eq!(
        h.image.delegation_tokens.keys().collect::<Vec<_>>(),
        ["long"]
    );
    h.now = 11 * HOUR;
    h.tick();
    assert!(
        h.image.delegation_tokens.is_empty(),
        "10h without a renewal"
    );
    assert_eq!(
        h.controller.next_deadline(&h.image),
        None,
        "no token, no sweep to wake for"
    );
    h.check_replay();
}

#[test]
fn without_a_secret_key_tokens_are_disabled() {
    let mut h = Harness::new();
    assert_eq!(
        create(&mut h, "t", "User:alice", &[], -1).error_code,
        ErrorCode::DELEGATION_TOKEN_AUTH_DISABLED
    );
    assert_eq!(
        change(&mut h, true, "t", "User:alice", -1).error_code,
        ErrorCode::DELEGATION_TOKEN_AUTH_DISABLED
    );
    assert!(h.image.delegation_tokens.is_empty());
}
