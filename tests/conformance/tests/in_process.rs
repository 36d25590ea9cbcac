//! The conformance suite over the in-process engine, world sizes 1 to 4.

compiler_collectives_conformance::in_process_tests!(
    all_gather_varlen,
    all_gather_empty,
    all_gather_fixed,
    broadcast_every_root,
    barrier_repeated,
    send_recv_ring,
    oversized_message_named,
    exchange_identical_fast_path,
    exchange_merges_differences,
    exchange_sequence_advances,
    desync_compile_keys,
    desync_sequence_numbers,
    desync_decision_kinds,
    config_disagreement,
    version_mismatch_named,
    version_mismatch_full_path,
    corrupt_payload_named,
    corrupt_payload_every_rank,
    slow_rank_within_deadline,
    unusable_after_error,
    missing_rank_times_out,
    abort_is_not_a_shutdown,
    shutdown_fails_peers_fast,
    must_agree_names_values,
    autotune_sharded_same_winner,
    autotune_lists_differ,
    cache_hit_agreement,
    tree_exchange_matches_flat,
);

/// Every behaviour of the suite is stamped above.
#[test]
fn every_behaviour_is_stamped() {
    let stamped = include_str!("in_process.rs");
    for b in compiler_collectives_conformance::BEHAVIOURS {
        assert!(
            stamped.contains(&format!("    {},\n", b.name)),
            "behaviour {} is not stamped for the in-process engine",
            b.name
        );
    }
}
