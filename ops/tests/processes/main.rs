//! Tests against separate processes on loopback: shard nodes and a
//! coordinator that are killed (SIGKILL), stopped (SIGSTOP), starved of
//! disk or files, and measured through /proc.
//!
//! This binary is also what it starts: run with `shard-node ...` or
//! `coordinator ...` it is that process (see `shoal_ops::procs`), so the
//! tests need no build step beyond their own. Tests run one at a time
//! (they time what processes do, on a machine with few cores).

mod chaos;
mod codes;
mod common;
mod connections;
mod control_plane;
mod disk_full;
mod filters;
mod hung_node;
mod limits;
mod moves;
mod replicas;
mod restarts;
mod scrub;
mod search_deadline;
mod snapshots;
mod telemetry;

use std::process::ExitCode;

use libtest_mimic::{Arguments, Trial};

fn main() -> ExitCode {
    if let Some(ran) = shoal_ops::procs::run_role_if_asked() {
        return match ran {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let mut args = Arguments::from_args();
    if args.test_threads.is_none() {
        args.test_threads = Some(1);
    }
    let tests = vec![
        trial(
            "a_full_disk_refuses_a_new_shard_and_the_node_keeps_serving",
            disk_full::a_full_disk_refuses_a_new_shard_and_the_node_keeps_serving,
        ),
        trial("a_search_past_its_deadline_stops_on_every_node", search_deadline::a_search_past_its_deadline_stops_on_every_node),
        trial("a_search_asking_too_much_is_refused_before_any_work", search_deadline::a_search_asking_too_much_is_refused_before_any_work),
        trial("shard_limits_hold_and_a_refused_create_leaves_nothing", limits::shard_limits_hold_and_a_refused_create_leaves_nothing),
        trial("a_low_open_file_limit_lowers_the_shard_limit", limits::a_low_open_file_limit_lowers_the_shard_limit),
        trial("dropped_collections_give_back_files_and_memory", limits::dropped_collections_give_back_files_and_memory),
        trial("every_documented_code_comes_from_a_real_failure", codes::every_documented_code_comes_from_a_real_failure),
        trial("a_stopped_node_does_not_hang_the_cluster", hung_node::a_stopped_node_does_not_hang_the_cluster),
        trial("filters_answer_whole_with_a_replica_down", filters::filters_answer_whole_with_a_replica_down),
        trial("silent_connections_are_closed_and_bounded", connections::silent_connections_are_closed_and_bounded),
        trial(
            "an_interrupted_collection_snapshot_is_listed_incomplete_and_pruned",
            snapshots::an_interrupted_collection_snapshot_is_listed_incomplete_and_pruned,
        ),
        trial("one_search_is_one_otlp_trace_with_a_span_per_shard", telemetry::one_search_is_one_otlp_trace_with_a_span_per_shard),
        trial(
            "otel_metrics_exporter_none_stops_the_otlp_metrics_push_only",
            telemetry::otel_metrics_exporter_none_stops_the_otlp_metrics_push_only,
        ),
        trial(
            "sampled_searches_are_whole_traces_and_the_others_leave_no_span",
            telemetry::sampled_searches_are_whole_traces_and_the_others_leave_no_span,
        ),
        trial("metrics_move_with_the_work_done", telemetry::metrics_move_with_the_work_done),
        trial("worker_threads_sets_the_threads_each_process_serves_on", telemetry::worker_threads_sets_the_threads_each_process_serves_on),
        trial("shoalctl_top_shows_the_metrics_of_each_node", telemetry::shoalctl_top_shows_the_metrics_of_each_node),
        trial("an_unreachable_otlp_collector_stalls_nothing", telemetry::an_unreachable_otlp_collector_stalls_nothing),
        trial(
            "etcd_controller_and_node_deaths_are_noticed_within_a_lease",
            control_plane::etcd_controller_and_node_deaths_are_noticed_within_a_lease,
        ),
        trial("etcd_chaos_a_short_run_loses_nothing", chaos::etcd_chaos_a_short_run_loses_nothing),
        trial(
            "a_stopped_replica_costs_a_search_a_hedge_not_its_deadline",
            replicas::a_stopped_replica_costs_a_search_a_hedge_not_its_deadline,
        ),
        trial(
            "etcd_a_node_restarted_at_once_takes_its_registration_over",
            restarts::etcd_a_node_restarted_at_once_takes_its_registration_over,
        ),
        trial("etcd_a_node_started_before_etcd_registers_once_it_is_up", restarts::etcd_a_node_started_before_etcd_registers_once_it_is_up),
        trial(
            "etcd_a_node_back_rejoins_and_a_node_gone_for_good_is_repaired",
            replicas::etcd_a_node_back_rejoins_and_a_node_gone_for_good_is_repaired,
        ),
        trial(
            "etcd_a_bit_flipped_on_a_replica_is_found_by_the_scrub_and_the_copy_made_again",
            scrub::etcd_a_bit_flipped_on_a_replica_is_found_by_the_scrub_and_the_copy_made_again,
        ),
        trial(
            "etcd_a_move_from_a_damaged_copy_is_given_up_and_the_copy_made_again",
            scrub::etcd_a_move_from_a_damaged_copy_is_given_up_and_the_copy_made_again,
        ),
        trial("etcd_a_move_survives_the_death_of_its_controller", moves::etcd_a_move_survives_the_death_of_its_controller),
        trial("etcd_a_dead_nodes_shard_is_recovered_from_its_snapshot", moves::etcd_a_dead_nodes_shard_is_recovered_from_its_snapshot),
        trial("etcd_a_move_whose_target_dies_is_rolled_back", moves::etcd_a_move_whose_target_dies_is_rolled_back),
        trial(
            "etcd_a_move_whose_source_dies_is_rolled_back_and_recovered",
            moves::etcd_a_move_whose_source_dies_is_rolled_back_and_recovered,
        ),
    ];
    libtest_mimic::run(&args, tests).exit_code()
}

fn trial(name: &'static str, test: fn() -> anyhow::Result<()>) -> Trial {
    Trial::test(name, move || test().map_err(|e| format!("{e:#}").into()))
}
