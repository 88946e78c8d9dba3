"""Which tests `make test-fast` leaves out: the tests that take more than ~5 s. The one home of the slow mark.

`make test-fast` (the developer's loop: `-m "not browser and not slow"`) must stay under 4 minutes on this 2-core
machine; `make test` runs everything, these included. Listed here, by path (every test of the file) or by
path::name: every test that starts a fresh interpreter, ranks or a notebook kernel (each `import lightning` costs ~5 s
of CPU here: torch, torch._dynamo, and torchmetrics with scipy; transformers too where it is installed, which is why
optimum-habana's tests run in their own environment, .venv-optimum), and the in-process tests --durations measured
at more than ~15 s on the shared machine (~5 s alone): torch.compile / dynamic-shape runs and fp8 convergence.
tests/test_suite_marks.py checks that every name here still names a test file or a test.
"""

from __future__ import annotations

import pytest

# "path" (the whole file), "path::test" or "path::Class::test", without parameters: every parametrization is slow.
SLOW_TESTS: frozenset[str] = frozenset({
    "tests/browser/test_multicard_browser.py",
    "tests/core/test_liveness_fabric_deepspeed.py",
    "tests/core/test_output_noise.py::test_a_fit_prints_no_warning_hpu_nb_could_prevent",
    "tests/core/test_output_noise.py::test_fabric_on_two_forked_cards_prints_no_warning_hpu_nb_could_prevent",
    "tests/core/test_parallel_liveness.py",
    "tests/core/test_start_up_interrupts.py",
    "tests/core/test_plugin_behaviours_deepspeed.py::test_deepspeed_accumulation_is_lightnings_own",
    "tests/core/test_plugin_behaviours_deepspeed.py::test_the_plugins_expected_loss_came_from_deepspeed_0_14s_warmup",
    "tests/core/test_plugin_behaviours_deepspeed.py::test_bf16_mixed_with_init_inference_runs_in_autocast",
    "tests/core/test_plugin_behaviours_deepspeed.py::test_bf16_true_with_init_inference_casts_inputs_to_the_engines_dtype",
    "tests/core/test_plugin_behaviours_deepspeed.py::test_configure_optimizers_returning_none_is_a_misconfiguration",
    "tests/core/test_plugin_behaviours_deepspeed.py::test_torch_compile_before_habanas_core_registers_habanas_backend_once",
    "tests/emulator/test_device_library_integrity.py::test_import_torch_survives_a_library_cut_short_and_first_use_rebuilds_it",
    "tests/emulator/test_device_library_integrity.py::test_the_build_command_finds_a_garbage_library_of_the_right_size_and_rebuilds_it",
    "tests/emulator/test_gpu_migration.py::test_a_cuda_written_script_trains_on_hpu_after_the_one_import",
    "tests/emulator/test_gpu_migration.py::test_nccl_typed_tensors_compile_and_what_habana_refuses",
    "tests/emulator/test_gpu_migration.py::test_nvml_queries_allocator_calls_and_cuda_memory_stat_names_answer_the_gaudi_way",
    "tests/emulator/test_gpu_migration.py::test_pt_hpu_gpu_migration_turns_it_on_where_the_bridge_reads_it",
    "tests/emulator/test_gpu_migration.py::test_pt_hpu_gpu_migration_with_a_plain_import_torch",
    "tests/emulator/test_gpu_migration.py::test_a_process_that_does_not_ask_keeps_torch_cuda_as_torch_made_it",
    "tests/emulator/test_gpu_migration.py::test_a_value_the_bridge_cannot_read_stops_the_import",
    "tests/emulator/test_gpu_migration.py::test_torch_amp_grad_scaler_for_cuda_is_disabled_and_lightning_auto_is_one_hpu",
    "tests/emulator/test_hccl_layouts.py::test_all_gather_into_tensor_fills_every_output_layout",
    "tests/emulator/test_hccl_layouts.py::test_all_gather_into_tensor_in_other_dtypes",
    "tests/emulator/test_hccl_layouts.py::test_reduce_scatter_tensor_reads_every_input_layout",
    "tests/emulator/test_hccl_layouts.py::test_sizes_are_checked_with_habanas_messages",
    "tests/emulator/test_hccl_layouts.py::test_list_all_gather_without_options_and_with_uneven_sizes",
    "tests/emulator/test_hpu_device.py::test_the_device_reads_the_execution_mode_when_it_loads",
    "tests/notebook/test_config_widget.py::test_every_valid_combination_trains",
    "tests/notebook/test_notebook_deepspeed.py::test_widget_zero3_offload_code_trains_three_epochs_in_a_kernel_without_barrier_warnings",
    "tests/notebook/test_notebook_multicard.py::test_every_strategy_hands_the_trained_weights_to_the_notebook",
    "tests/notebook/test_notebook_multicard.py::test_memory_monitor_on_two_cards_draws_every_rank_live",
    "tests/notebook/test_notebook_multicard.py::test_fabric_returns_tensors_to_the_notebook",
    "tests/notebook/test_notebook_multicard.py::test_two_card_monitor_cell_shows_one_progress_bar_ending_at_the_last_step",
    "tests/notebook/test_notebook_multicard.py::test_two_card_ddp_cell_shows_one_progress_bar_ending_at_the_last_step",
    "tests/notebook/test_notebook_multicard.py::test_forked_workers_output_reaches_the_notebook_complete_and_in_order",
    "tests/notebook/test_notebook_multicard.py::test_fabric_workers_prints_reach_the_notebook_complete_and_in_order",
    "tests/notebook/test_notebook_multicard.py::test_interrupting_a_two_card_fit_leaves_one_line_the_weights_of_its_step_and_a_kernel_that_trains",
    "tests/notebook/test_parallel_notebook.py::test_a_stuck_rank_ends_the_cell_named_and_leaves_no_worker",
    "tests/notebook/test_tutorials.py",
    "tests/runtime/test_packaging.py::test_the_setup_plans_torch_cpu_and_no_cuda_package",
    "tests/runtime/test_packaging.py::test_the_installed_wheel_builds_the_device_trains_on_hpu_and_runs_gaudi_code",
    "tests/runtime/test_packaging.py::test_the_installed_wheels_finder_serves_lightning_habana",
    "tests/runtime/test_packaging.py::test_after_binders_postbuild_the_tutorial_notebooks_compile_nothing",
    "tests/runtime/test_torch_builds.py::test_torch_accelerator_answers_before_and_after_hpu_is_used",
    "tests/runtime/test_torch_builds.py::test_two_cards_ddp_from_a_script_train_the_same_weights",
    "tests/runtime/test_torch_builds.py::test_a_notebook_cell_trains_on_hpu",
    "tests/third_party/test_gaudi_tutorials_runner.py::test_the_probe_tells_a_process_that_used_hpu_from_one_that_did_not",
    "tests/third_party/test_gaudi_tutorials_runner.py::test_the_lightning_probe_records_each_steps_loss_and_device",
    "tests/third_party/test_lightning_habana_names.py::test_every_module_path_imports_and_its_names_are_hpu_nbs",
    "tests/third_party/test_lightning_habana_names.py::test_without_lightning_the_names_are_the_pytorch_lightning_flavours_and_train",
    "tests/third_party/test_lightning_habana_names.py::test_a_real_lightning_habana_on_the_path_wins",
    "tests/third_party/test_lightning_habana_names.py::test_on_a_gaudi_without_the_plugin_the_names_are_served_too",
    "tests/third_party/test_lightning_habana_names.py::test_the_autoload_switch_leaves_lightning_habana_unfound",
    "tests/third_party/test_lightning_habana_names.py::test_seed_mixed_precision_examples",
    "tests/third_party/test_lightning_habana_names.py::test_seed_fp8_training_example",
    "tests/third_party/test_lightning_habana_names.py::test_seed_fp8_inference_examples_measure_then_quantize_in_a_fresh_process",
    "tests/third_party/test_lightning_habana_names.py::test_seed_device_stats_monitor_example",
    "tests/third_party/test_lightning_habana_names.py::test_seed_profiler_examples",
    "tests/third_party/test_lightning_habana_names.py::test_seed_deepspeed_examples_build_their_trainers",
    "tests/third_party/test_lightning_habana_names.py::test_seed_deepspeed_bf16_optimizer_example_trains_on_two_cards",
    "tests/third_party/test_lightning_habana_names.py::test_seed_readme_example",
    "tests/third_party/test_lightning_habana_names.py::test_lightning_habanas_lightning_flavour_in_a_pytorch_lightning_trainer_names_the_import",
    "tests/third_party/test_plugin_examples.py",
    "tests/third_party/test_third_party_gaudi_code.py::test_lightning_habana_hpu_graphs_flows_train_and_test_as_without_graphs",
    "tests/third_party/test_third_party_gaudi_code.py::test_the_optimum_layer_runs_this_torch_and_hpu_nb_and_keeps_transformers_out_of_here",
    "tests/third_party/test_third_party_gaudi_code.py::test_gaudi_trainer_trains_a_tiny_llama_with_habanas_fused_adamw_and_clip_norm",
    "tests/third_party/test_third_party_gaudi_code.py::test_gaudi_trainer_trains_tiny_gpt2_and_bert_in_lazy_mode",
    "tests/third_party/test_third_party_gaudi_code.py::test_gaudi_trainer_trains_in_fp8_with_habanas_transformer_engine",
    "tests/third_party/test_third_party_gaudi_code.py::test_generation_with_hpu_graphs_gives_plain_transformers_tokens",
    "tests/third_party/test_transformers_on_hpu.py",
    "tests/traces/test_trace_hostile_files.py::test_a_gzip_bomb_of_zeros_is_refused_without_growing",
    "tests/traces/test_trace_hostile_files.py::test_a_gzip_bomb_of_whitespace_inside_the_events_loads_in_bounded_memory",
    "tests/fake_habana/test_conformance.py::test_autocast_on_hpu_with_the_release_op_lists_replacing_the_defaults",
    "tests/fake_habana/test_conformance.py::test_core_is_lazy_only_the_literal_0_means_eager",
    "tests/fake_habana/test_conformance.py::test_core_torch_compile_hpu_backend_in_eager_mode",
    "tests/fake_habana/test_conformance.py::test_hccl_import_initialises_from_the_environment_and_may_set_master_port",
    "tests/fake_habana/test_conformance.py::test_hpu_acquisition_by_hls_module_id_else_any_free_card",
    "tests/fake_habana/test_conformance.py::test_hpu_metrics_unknown_name_is_none_and_recipe_cache_needs_its_variable",
    "tests/fake_habana/test_conformance.py::test_hpu_torch_knows_the_accelerator_from_import_without_a_card",
    "tests/fake_habana/test_conformance.py::test_releases_import_torch_autoloads_habana_in_eager_mode",
    "tests/core/test_card_acquisition.py::test_notebook_fork_acquires_one_card_per_worker_and_none_in_the_kernel",
    "tests/core/test_card_acquisition.py::test_script_launcher_acquires_one_card_per_worker_and_none_before_launching",
    "tests/core/test_checkpoint_io.py::test_killing_a_saving_process_never_corrupts_the_previous_checkpoint",
    "tests/core/test_checkpoint_io.py::test_the_next_save_removes_the_temp_file_a_killed_saver_left",
    "tests/core/test_cli.py::test_lightning_cli_trains_on_hpu",
    "tests/emulator/test_compile.py::test_plain_torch_code_finds_hpu_backend_without_hpu_nb",
    "tests/notebook/test_config_widget.py::test_generated_code_builds_the_same_trainer",
    "tests/core/test_deepspeed.py::test_json_config_file_bf16_and_the_module_optimizer_wins",
    "tests/core/test_deepspeed.py::test_single_process_zero_fit",
    "tests/core/test_deepspeed.py::test_stage_2_with_optimizer_offload_saves_and_resumes",
    "tests/core/test_deepspeed.py::test_two_process_zero_fit_and_checkpoint_loads_into_a_single_device_run",
    "tests/core/test_deepspeed_fp8.py::test_fp8_inference_with_deepspeed_measures_then_quantizes_in_a_fresh_process",
    "tests/core/test_deepspeed_fp8.py::test_fp8_training_with_deepspeed_tracks_bf16",
    "tests/emulator/test_dynamic_shapes.py::test_a_dynamic_model_compiles_less_with_the_switch_on",
    "tests/emulator/test_dynamic_shapes.py::test_compilations_are_logged_per_epoch",
    "tests/emulator/test_dynamic_shapes.py::test_metric_global_as_habana_s",
    "tests/emulator/test_dynamic_shapes.py::test_the_environment_switch_is_read_by_a_new_process",
    "tests/core/test_fabric.py::test_fabric_ddp_on_two_cards_from_a_script",
    "tests/core/test_fabric.py::test_fabric_ddp_on_two_cards_of_the_fake_gaudi",
    "tests/core/test_fabric.py::test_fabric_fsdp_on_two_cards_from_a_script",
    "tests/core/test_fabric.py::test_fabric_on_two_cards_from_a_notebook_cell",
    "tests/core/test_fabric.py::test_standalone_lightning_fabric_on_two_cards",
    "tests/runtime/test_start_up_pth.py",
    "tests/runtime/test_first_line_import.py::test_a_program_that_never_imports_habana_loads_nothing_of_hpu_nb",
    "tests/runtime/test_first_line_import.py::test_a_script_whose_first_line_imports_habana_trains_on_the_emulated_gaudi",
    "tests/runtime/test_first_line_import.py::test_habanas_own_package_wins_where_it_is_installed",
    "tests/runtime/test_first_line_import.py::test_intel_transformer_engine_is_the_emulated_transformer_engine_by_name_and_distribution",
    "tests/runtime/test_first_line_import.py::test_notebook_kernels_of_this_venv_find_its_pip_first",
    "tests/runtime/test_first_line_import.py::test_the_autoload_switch_leaves_habana_unfound",
    "tests/runtime/test_first_line_import.py::test_the_emulated_release_is_an_installed_distribution_for_pip_and_importlib",
    "tests/core/test_flavours.py::test_a_fresh_python_on_the_standalone_packages_never_loads_lightning_or_hpu_nb_core",
    "tests/core/test_flavours.py::test_a_fresh_python_loads_the_standalone_flavour_from_the_cache_without_translating",
    "tests/core/test_fp8_inference.py::test_quantize_reads_the_given_folder_not_the_one_recorded_at_measure_time",
    "tests/core/test_fp8_inference.py::test_round_trip_quantizes_in_a_fresh_process_within_a_few_percent",
    "tests/core/test_fp8_inference.py::test_two_card_measurement_files_are_found_by_a_two_card_quantize",
    "tests/core/test_fp8_inference.py::test_without_a_path_measurements_go_to_the_cache_directory_and_a_fresh_process_finds_them",
    "tests/core/test_fp8_training.py::test_fp8_training_converges_within_10_percent_of_bf16",
    "tests/core/test_fsdp.py::test_two_process_fsdp_full_state_dict_resumes_on_one_device",
    "tests/core/test_fsdp.py::test_two_process_fsdp_sharded_checkpoint_consolidates_for_one_device",
    "tests/core/test_gaudi_lightning.py::test_two_rank_ddp_on_the_fake_gaudi_trains_on_hpu_over_hccl",
    "tests/third_party/test_gaudi_style_code.py::test_a_gaudi_script_runs_in_a_fresh_interpreter_that_never_imports_hpu_nb",
    "tests/emulator/test_hpu_device.py::test_op_list_files_change_dtypes_in_a_new_process",
    "tests/runtime/test_hpu_info.py::test_collecting_on_the_emulated_gaudi_imports_no_lightning",
    "tests/runtime/test_hpu_info.py::test_emulated_is_said_plainly_and_cheap",
    "tests/core/test_import.py::test_import_touches_nothing_heavy",
    "tests/core/test_import.py::test_lightning_learns_hpu_whichever_is_imported_first",
    "tests/core/test_multi_tenancy.py::test_two_tenants_train_at_the_same_time_on_their_own_cards",
    "tests/notebook/test_notebook_snapshots.py::test_each_widget_output_is_followed_by_its_snapshot",
    "tests/notebook/test_notebook_snapshots.py::test_nbconvert_html_shows_every_snapshot",
    "tests/notebook/test_notebook_snapshots.py::test_the_chart_displayed_alone_leaves_the_monitors_snapshot",
    "tests/core/test_oplists.py::test_applying_sets_the_variables_the_release_reads_for_worker_processes",
    "tests/core/test_oplists.py::test_lower_list_alone_under_its_old_name_warns_once_naming_the_new_variable",
    "tests/runtime/test_packaging.py::test_a_killed_build_leaves_no_compiler_running_and_the_next_build_discards_its_folder",
    "tests/runtime/test_packaging.py::test_pip_install_on_a_gaudi_container_replaces_none_of_habanas_packages",
    "tests/runtime/test_packaging.py::test_wheel_and_sdist_carry_every_file_of_the_package",
    "tests/core/test_parallel.py::test_a_crashing_rank_fails_the_run_fast_with_its_error",
    "tests/core/test_parallel.py::test_a_program_that_leaves_its_hccl_group_gets_it_destroyed_before_finalization",
    "tests/core/test_parallel.py::test_a_worker_forked_after_backward_passes_runs_autograd_on_hpu",
    "tests/core/test_parallel.py::test_reduce_semantics_across_two_processes",
    "tests/core/test_parallel.py::test_two_process_ddp_fit_from_a_script",
    "tests/notebook/test_parallel_notebook.py::test_two_cards_from_a_notebook_kernel",
    "tests/core/test_plugin_behaviours.py::test_deepspeed_cpu_checkpointing_recomputes_from_a_cpu_copy",
    "tests/core/test_plugin_behaviours.py::test_deepspeed_fp16_trains_on_gaudi2",
    "tests/core/test_plugin_behaviours.py::test_deepspeed_init_inference_arguments_reach_the_inference_engine",
    "tests/core/test_plugin_behaviours.py::test_fsdp_cpu_offload_keeps_parameters_on_the_host_and_trains_the_same",
    "tests/core/test_plugin_behaviours_auto_accelerator.py::test_hccl_reduces_with_product_on_the_device",
    "tests/core/test_profiler.py::test_import_order_does_not_matter",
    "tests/core/test_profiler.py::test_the_profiler_and_traces_import_no_notebook_layer",
    "tests/core/test_pytorch_lightning.py::test_a_fresh_python_that_never_imports_hpu_nb_builds_an_hpu_trainer",
    "tests/core/test_pytorch_lightning.py::test_after_import_torch_alone_torch_hpu_is_there_as_on_a_gaudi_and_the_device_waits_for_its_first_use",
    "tests/core/test_pytorch_lightning.py::test_the_autoload_can_be_switched_off",
    "tests/core/test_pytorch_lightning.py::test_torch_hpu_after_import_torch_follows_habana_s_autoload_rule",
    "tests/third_party/test_third_party_gaudi_code.py::test_a_model_references_script_that_imports_habana_first_trains_and_evaluates",
})


def unparametrized(nodeid: str) -> str:
    """The node id without its parameters."""
    return nodeid.split("[", 1)[0]


def mark_slow(items: list[pytest.Item]) -> None:
    for item in items:
        name = unparametrized(item.nodeid)
        if name in SLOW_TESTS or name.split("::", 1)[0] in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)


class MeasuredSlow:
    """A plugin (tests/conftest.py registers it): marks before `-m "not slow"` deselects (a conftest's own hook of
    that name runs after, for the xdist groups)."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        mark_slow(items)
