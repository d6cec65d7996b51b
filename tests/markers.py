"""Which tests are ``e2e`` and which ``slow``, by file and test name, in one place: :func:`assign` marks
them at collection (``tests/conftest.py``); ``make test-fast`` (``-m "not slow and not e2e"``) leaves them
out, ``make test`` runs them all.

- ``e2e``: several processes (workers racing or SIGKILLed, DDP ranks, ``ablate`` commands stopped and
  resumed), a server, or a whole study run to its end.
- ``slow``: a test over about 3 s on the 2-core development machine, busy as it usually is
  (``pytest --durations=0``), its module's fixtures counted (the bound that keeps ``make test-fast``
  within 3 minutes there); a whole file where its module fixture trains (every test of it would pay
  for that); a parametrized test as a whole where most of its cases are, or all together take 10 s.

A file (its path under ``tests/``) maps to None (every test in it) or to test names: a parametrized test
by its name (every case) or by its full id (one case). :func:`test_markers.test_every_marked_test_exists`
keeps the tables true to the files."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
Table = Mapping[str, tuple[str, ...] | None]

E2E: Table = {
    "datamodules/test_data_tokenizer.py": ("test_the_same_documents_give_the_same_tokenizer_in_every_process",),
    "sweeps/engine/test_runner_ddp.py": None,
    "sweeps/engine/test_runner_lifecycle.py": None,
    "sweeps/test_chain.py": (
        "test_a_chained_trial_nests_its_stages_and_carries_their_metrics",
        "test_fine_tuning_seeds_give_mean_and_std",
        "test_each_variant_is_fine_tuned_its_own_way_and_logs_its_techniques",
    ),
    "sweeps/test_dashboard.py": None,
    "sweeps/test_glue.py": ("test_a_chained_study_reports_the_glue_score",),
    "sweeps/test_kill_resume.py": None,
    "sweeps/test_many_workers.py": None,
    "sweeps/test_smoke.py": (
        "test_every_shipped_study_runs_in_smoke_mode",
        "test_a_run_that_fails_makes_the_smoke_fail_and_says_which",
    ),
    "sweeps/test_span_study.py": ("test_a_chained_study_fine_tunes_squad_beside_a_glue_task",),
    "sweeps/test_study_source.py": ("test_a_study_fine_tunes_a_run_over_seeds_and_reports_intervals",),
    "test_doc_examples.py": (
        "test_the_first_session_runs_and_prints_where_its_report_is",
        "test_the_data_catalog_examples_run",
        "test_the_accuracy_guard_example_runs",
    ),
    "sweeps/test_study_teacher.py": (
        "test_teacher_trained_once_and_reused",
        "test_failed_teacher_training_fails_the_study",
    ),
    "sweeps/test_sweep_e2e.py": None,
    "sweeps/test_task_teachers.py": ("test_a_task_teacher_is_the_study_model_fine_tuned_once",),
    "test_quiet_commands.py": (  # every kind of command, each a process, on one store
        "test_a_command_prints_no_library_note",
        "test_verbose_shows_the_notes_that_are_hidden_otherwise",
    ),
    "test_readme_table.py": (  # the quickstart study swept and reported at its smallest
        "test_the_readme_table_has_the_reports_columns_rows_and_counted_cells",
        "test_the_readme_shows_what_ablate_report_prints",
    ),
}
"""Tests of several processes, servers, or whole studies."""

SLOW: Table = {
    "benchmarks/test_deploy.py": ("test_the_smoke_bench_prints_the_table_and_ends_with_the_int8_ratio",),
    "benchmarks/test_loop_bench.py": ("test_a_tiny_run_reports_loop_over_step",),
    "benchmarks/test_loop_regimes.py": (
        "test_each_regime_runs_and_prints_its_table",
        "test_fine_tuning_compiled_runs_bucketed_and_reports_its_host_time",
        "test_the_loop_and_the_step_alone_see_the_same_batches",
    ),
    "benchmarks/test_loop_tasks.py": ("test_a_task_runs_and_its_table_names_it",),
    "benchmarks/test_study_bench.py": (
        "test_a_chained_trials_stages_are_clocked_and_named_in_their_parts",
        "test_a_two_trial_study_splits_each_runs_wall_time",
    ),
    "benchmarks/test_train_speed.py": (
        "test_sides_start_equal_and_stay_close",
        "test_transformers_compiled_trains_the_same_batches_to_a_close_loss",
    ),
    "datamodules/test_collate_padding.py": ("test_a_compiled_step_sees_a_few_bucketed_widths_and_the_same_logits",),
    "datamodules/test_data_classification.py": None,
    "datamodules/test_data_corpus.py": ("test_two_workers_read_disjoint_documents_of_one_file",),
    "datamodules/test_data_pairs.py": None,
    "datamodules/test_data_pretrain.py": ("test_two_workers",),
    "datamodules/test_squad.py": (
        "test_a_batched_fetch_collates_windows_as_one_by_one_does",
        "test_windows_cover_long_contexts_and_label_the_answer_tokens",
    ),
    "datamodules/test_transfer.py": (
        "test_a_shuffled_task_loader_draws_as_a_seeded_shuffle_and_resumes_at_any_batch[1]",
    ),
    "lightning_modules/interop/test_export_usable.py": (
        "test_a_regression_model_exports_as_one_output_that_the_pipeline_returns_raw",
    ),
    "lightning_modules/interop/test_interop_classifier.py": ("test_round_trip_gives_the_same_logits[bert-tiny]",),
    "lightning_modules/interop/test_onnx_card.py": ("test_the_cards_snippet_runs_as_written_and_predicts_as_ablate",),
    "lightning_modules/interop/test_onnx_export.py": None,
    "lightning_modules/measure/test_deployed.py": (
        "test_a_torch_model_is_timed_at_one_thread_and_every_thread_and_threads_are_restored",
    ),
    "lightning_modules/measure/test_measure_cache.py": ("test_a_repeat_run_reuses_the_measurement_and_says_so",),
    "lightning_modules/measure/test_profiling.py": (
        "test_bf16_runs_measure_under_the_runs_autocast",
        "test_latency_positive_and_grows_with_batch",
        "test_params_measure_json_has_measured_keys",
    ),
    "lightning_modules/measure/test_reference_load.py": None,
    "lightning_modules/methods/quantization/test_hessian.py": (
        "test_each_layer_of_the_ablate_model_matches_the_eigenvalues_of_its_full_hessian",
    ),
    "lightning_modules/methods/quantization/test_quantization.py": (
        "test_bert_base_with_4_bit_groups_and_int8_embeddings_is_a_fifth_of_fp32",
        "test_dynamic_int8_shrinks_bert_base_to_at_most_60_percent",
    ),
    "lightning_modules/methods/test_compile.py": (
        "test_compiled_pretraining_reuses_its_layers_across_heads_objectives_and_rates",
        "test_every_distillation_stage_is_one_graph",
        "test_every_fine_tuning_stage_is_one_graph",
        "test_pretraining_step_is_one_graph",
        "test_the_layer_block_is_one_graph_per_layer_shape",
    ),
    "sweeps/engine/test_trainer_loop.py": (
        "test_a_loss_that_turns_nan_fails_the_run_at_that_step",
        "test_bf16_with_gradient_clipping_trains_with_the_fused_optimizer",
        "test_the_guard_checks_every_log_every_steps_and_names_the_first_bad_step",
    ),
    "lightning_modules/methods/test_probe.py": ("test_intrinsic_eval_scores_in_range",),
    "lightning_modules/methods/test_squad_metrics.py": (
        "test_squad_v1_em_and_f1_are_the_official_ones_to_the_last_digit",
    ),
    "reports/test_pareto.py": (
        "test_a_guarded_study_reports_its_front_and_choice",
        "test_front_marks_the_bound_the_front_and_the_choice",
    ),
    "reports/test_remeasure.py": None,
    "reports/test_remeasure_deployed.py": None,
    "reports/test_report_build.py": None,
    "reports/test_report_experiment.py": None,
    "reports/test_report_runs.py": ("test_unreachable_store_fails_fast[http://127.0.0.1:9-http://127.0.0.1:9]",),
    "reports/test_report_seeds.py": None,
    "reports/test_report_specs.py": None,
    "reports/test_report_tables.py": None,
    "reports/test_report_target.py": (
        "test_a_report_before_any_sweep_says_which_command_makes_the_runs",
        "test_a_row_short_of_its_seeds_says_how_many_never_started",
        "test_cells_that_never_started_are_listed_as_missing",
        "test_runs_of_another_grid_are_not_held_against_this_one",
    ),
    "sweeps/engine/test_checkpoints.py": (
        "test_a_killed_run_resumes_on_another_machine_from_its_uploaded_checkpoint",
        "test_a_run_says_nothing_of_weights_only",
        "test_resuming_a_finished_training_still_logs_its_final_validation",
    ),
    "sweeps/engine/test_context.py": ("test_an_active_run_logs_registered_metrics_in_one_batch_and_refuses_the_rest",),
    "sweeps/engine/test_finetune_task_distill.py": None,
    "sweeps/engine/test_finetune_train.py": None,
    "sweeps/engine/test_phases_resume.py": None,
    "sweeps/engine/test_predictions.py": None,
    "sweeps/engine/test_pretrain_distill.py": None,
    "sweeps/engine/test_pretrain_presets.py": ("test_preset_trains_a_few_steps",),
    "sweeps/engine/test_prune_train.py": None,
    "sweeps/engine/test_quant_stored.py": None,
    "sweeps/engine/test_quant_train.py": None,
    "sweeps/engine/test_sources_public_checkpoints.py": None,
    "sweeps/engine/test_span_train.py": None,
    "sweeps/engine/test_tracking_experiment_kind.py": (
        "test_a_created_experiment_is_a_model_training_one",
        "test_an_older_experiment_gets_the_kind_and_a_chosen_kind_stays",
        "test_the_link_shows_the_trials_of_the_study_unfolded",
        "test_the_printed_lines",
    ),
    "sweeps/engine/test_trainer_lightning_knobs.py": None,
    "sweeps/engine/test_weights_export_classifier.py": None,
    "sweeps/engine/test_weights_export_cli.py": None,
    "sweeps/engine/test_weights_export_pairs.py": None,
    "sweeps/engine/test_weights_export_regression.py": None,
    "sweeps/test_cli_errors.py": ("test_cli_errors_are_one_line", "test_params_json_matches_published_cell"),
    "sweeps/test_estimate.py": ("test_a_sweep_prints_it_before_its_first_trial",),
    "sweeps/test_glue.py": (  # the module's fine-tuned runs (the chained study is e2e)
        "test_stsb_is_a_regression_scored_by_pearson_and_spearman",
        "test_mrpc_logs_f1_and_accuracy_and_scores_their_mean",
        "test_mnli_is_scored_on_both_dev_sets",
        "test_bad_glue_input_is_one_line_before_any_run",
        "test_a_study_may_optimize_a_further_dev_sets_metric",
    ),
    "sweeps/test_guard.py": (  # the module's study
        "test_the_best_feasible_trial_is_chosen_and_optuna_agrees",
        "test_when_none_is_feasible_the_closest_is_kept_and_said",
    ),
    "sweeps/test_recipes.py": ("test_the_distilbert_recipe_runs_from_the_catalogs_bert_base_uncased",),
    "sweeps/test_study_data.py": (
        "test_a_run_through_the_catalog_is_tagged_with_its_files",
        "test_every_shipped_study_checks_with_and_without_the_catalog",
    ),
    "sweeps/test_study_model_runs.py": (
        "test_a_dead_workers_model_runs_end_killed_whatever_their_role",
        "test_a_finished_model_is_found_by_its_config_digest_new_or_old",
    ),
    "sweeps/test_study_source.py": ("test_a_source_that_is_not_there_is_refused_and_nothing_is_made",),
    "sweeps/test_trial.py": ("test_a_trial_ends_as_its_row_says[COMPLETE]",),
    "test_bad_input.py": (
        "test_a_corrupt_record_deep_in_the_corpus_fails_the_run_in_one_line",
        "test_bad_input_is_one_line_exit_2_and_creates_nothing",
    ),
    "test_bad_input_classes.py": (
        "test_a_study_whose_search_changed_since_its_trials_ran_is_named_before_anything_is_written",
        "test_a_valid_search_over_ranges_is_accepted",
    ),
    "test_cli_steering.py": ("test_an_overridden_sweep_is_a_study_of_its_own_and_runs_with_the_override",),
    "test_doc_examples.py": (
        "test_the_onnx_export_and_its_snippet_run",
        "test_python_excerpts_compile_and_their_imports_import",
    ),
    "test_docs.py": ("test_site_builds_strict",),
    "test_forked.py": None,  # the fork server's imports, and a new interpreter to compare with
    "test_layout.py": (
        "test_help_and_config_errors_answer_without_torch",
        "test_names_are_imported_from_their_home",
        "test_params_counts_without_lightning",
    ),
    "test_packaging.py": ("test_test_imports_are_declared", "test_the_scan_sees_the_product"),
    "test_plan_first.py": ("test_refused_by_the_plan_with_nothing_written",),
    "test_quiet.py": None,
}
"""Tests over about 3 s on the development machine (not e2e)."""

MARKERS: Mapping[str, Table] = {"e2e": E2E, "slow": SLOW}


def marked(table: Table, path: str, name: str, original: str) -> bool:
    """Whether test ``name`` (``original`` without its parameters) of file ``path`` is in ``table``."""
    if path not in table:
        return False
    names = table[path]
    return names is None or name in names or original in names


def assign(items: Iterable[pytest.Item]) -> None:
    """Mark each collected test ``e2e`` and ``slow`` as the tables say."""
    for item in items:
        try:
            path = item.path.relative_to(TESTS).as_posix()
        except ValueError:
            continue
        original = getattr(item, "originalname", item.name)
        for marker, table in MARKERS.items():
            if marked(table, path, item.name, original):
                item.add_marker(marker)
