"""Which tests `make test-fast` leaves out: the tests that take more than ~5 s, beyond those marked in their files.

`make test-fast` (the developer's loop: `-m "not browser and not slow"`) must stay under 4 minutes on this 2-core
machine; `make test` runs everything, these included. Listed here (rather than marked in files other people are
editing): every test that starts a fresh interpreter, ranks or a notebook kernel (each `import lightning` costs ~5 s
of CPU here: torch, torch._dynamo, and torchmetrics with scipy; transformers too where it is installed, which is why
optimum-habana's tests run in their own environment, .venv-optimum), and the in-process tests --durations measured
at more than ~15 s on the shared machine (~5 s alone): torch.compile / dynamic-shape runs and fp8 convergence.
tests/test_suite_marks.py checks that every name here still names a test.
"""

from __future__ import annotations

import pytest

# "path::test" (or "path::Class::test"), without parameters: every parametrization is slow.
SLOW_TESTS: frozenset[str] = frozenset({
    "tests/fake_habana/test_conformance.py::test_autocast_on_hpu_with_the_release_op_lists_replacing_the_defaults",
    "tests/fake_habana/test_conformance.py::test_core_is_lazy_only_the_literal_0_means_eager",
    "tests/fake_habana/test_conformance.py::test_core_torch_compile_hpu_backend_in_eager_mode",
    "tests/fake_habana/test_conformance.py::test_hccl_import_initialises_from_the_environment_and_may_set_master_port",
    "tests/fake_habana/test_conformance.py::test_hpu_acquisition_by_hls_module_id_else_any_free_card",
    "tests/fake_habana/test_conformance.py::test_hpu_metrics_unknown_name_is_none_and_recipe_cache_needs_its_variable",
    "tests/fake_habana/test_conformance.py::test_hpu_torch_knows_the_accelerator_from_import_without_a_card",
    "tests/fake_habana/test_conformance.py::test_releases_import_torch_autoloads_habana_in_eager_mode",
    "tests/test_card_acquisition.py::test_notebook_fork_acquires_one_card_per_worker_and_none_in_the_kernel",
    "tests/test_card_acquisition.py::test_script_launcher_acquires_one_card_per_worker_and_none_before_launching",
    "tests/test_checkpoint_io.py::test_killing_a_saving_process_never_corrupts_the_previous_checkpoint",
    "tests/test_checkpoint_io.py::test_the_next_save_removes_the_temp_file_a_killed_saver_left",
    "tests/test_cli.py::test_lightning_cli_trains_on_hpu",
    "tests/test_compile.py::test_plain_torch_code_finds_hpu_backend_without_hpu_nb",
    "tests/test_config_widget.py::test_generated_code_builds_the_same_trainer",
    "tests/test_deepspeed.py::test_json_config_file_bf16_and_the_module_optimizer_wins",
    "tests/test_deepspeed.py::test_single_process_zero_fit",
    "tests/test_deepspeed.py::test_stage_2_with_optimizer_offload_saves_and_resumes",
    "tests/test_deepspeed.py::test_two_process_zero_fit_and_checkpoint_loads_into_a_single_device_run",
    "tests/test_deepspeed_fp8.py::test_fp8_inference_with_deepspeed_measures_then_quantizes_in_a_fresh_process",
    "tests/test_deepspeed_fp8.py::test_fp8_training_with_deepspeed_tracks_bf16",
    "tests/test_dynamic_shapes.py::test_a_dynamic_model_compiles_less_with_the_switch_on",
    "tests/test_dynamic_shapes.py::test_compilations_are_logged_per_epoch",
    "tests/test_dynamic_shapes.py::test_metric_global_as_habana_s",
    "tests/test_dynamic_shapes.py::test_the_environment_switch_is_read_by_a_new_process",
    "tests/test_fabric.py::test_fabric_ddp_on_two_cards_from_a_script",
    "tests/test_fabric.py::test_fabric_ddp_on_two_cards_of_the_fake_gaudi",
    "tests/test_fabric.py::test_fabric_fsdp_on_two_cards_from_a_script",
    "tests/test_fabric.py::test_fabric_on_two_cards_from_a_notebook_cell",
    "tests/test_fabric.py::test_standalone_lightning_fabric_on_two_cards",
    "tests/test_first_line_import.py::test_a_program_that_never_imports_habana_loads_nothing_of_hpu_nb",
    "tests/test_first_line_import.py::test_a_script_whose_first_line_imports_habana_trains_on_the_emulated_gaudi",
    "tests/test_first_line_import.py::test_habanas_own_package_wins_where_it_is_installed",
    "tests/test_first_line_import.py::test_intel_transformer_engine_is_the_emulated_transformer_engine_by_name_and_distribution",
    "tests/test_first_line_import.py::test_notebook_kernels_of_this_venv_find_its_pip_first",
    "tests/test_first_line_import.py::test_the_autoload_switch_leaves_habana_unfound",
    "tests/test_first_line_import.py::test_the_emulated_release_is_an_installed_distribution_for_pip_and_importlib",
    "tests/test_flavours.py::test_a_fresh_python_on_the_standalone_packages_never_loads_lightning_or_hpu_nb_core",
    "tests/test_flavours.py::test_a_fresh_python_loads_the_standalone_flavour_from_the_cache_without_translating",
    "tests/test_fp8_inference.py::test_quantize_reads_the_given_folder_not_the_one_recorded_at_measure_time",
    "tests/test_fp8_inference.py::test_round_trip_quantizes_in_a_fresh_process_within_a_few_percent",
    "tests/test_fp8_inference.py::test_two_card_measurement_files_are_found_by_a_two_card_quantize",
    "tests/test_fp8_inference.py::test_without_a_path_measurements_go_to_the_cache_directory_and_a_fresh_process_finds_them",
    "tests/test_fp8_training.py::test_fp8_training_converges_within_10_percent_of_bf16",
    "tests/test_fsdp.py::test_two_process_fsdp_full_state_dict_resumes_on_one_device",
    "tests/test_fsdp.py::test_two_process_fsdp_sharded_checkpoint_consolidates_for_one_device",
    "tests/test_gaudi_lightning.py::test_two_rank_ddp_on_the_fake_gaudi_trains_on_hpu_over_hccl",
    "tests/test_gaudi_style_code.py::test_a_gaudi_script_runs_in_a_fresh_interpreter_that_never_imports_hpu_nb",
    "tests/test_hpu_device.py::test_op_list_files_change_dtypes_in_a_new_process",
    "tests/test_hpu_info.py::test_collecting_on_the_emulated_gaudi_imports_no_lightning",
    "tests/test_hpu_info.py::test_emulated_is_said_plainly_and_cheap",
    "tests/test_import.py::test_import_touches_nothing_heavy",
    "tests/test_import.py::test_lightning_learns_hpu_whichever_is_imported_first",
    "tests/test_multi_tenancy.py::test_two_tenants_train_at_the_same_time_on_their_own_cards",
    "tests/test_notebook_snapshots.py::test_each_widget_output_is_followed_by_its_snapshot",
    "tests/test_notebook_snapshots.py::test_nbconvert_html_shows_every_snapshot",
    "tests/test_notebook_snapshots.py::test_the_chart_displayed_alone_leaves_the_monitors_snapshot",
    "tests/test_oplists.py::test_applying_sets_the_variables_the_release_reads_for_worker_processes",
    "tests/test_oplists.py::test_lower_list_alone_under_its_old_name_warns_once_naming_the_new_variable",
    "tests/test_packaging.py::test_a_killed_build_leaves_no_compiler_running_and_the_next_build_discards_its_folder",
    "tests/test_packaging.py::test_pip_install_on_a_gaudi_container_replaces_none_of_habanas_packages",
    "tests/test_packaging.py::test_wheel_and_sdist_carry_every_file_of_the_package",
    "tests/test_parallel.py::test_a_crashing_rank_fails_the_run_fast_with_its_error",
    "tests/test_parallel.py::test_a_program_that_leaves_its_hccl_group_gets_it_destroyed_before_finalization",
    "tests/test_parallel.py::test_a_worker_forked_after_backward_passes_runs_autograd_on_hpu",
    "tests/test_parallel.py::test_reduce_semantics_across_two_processes",
    "tests/test_parallel.py::test_two_process_ddp_fit_from_a_script",
    "tests/test_parallel_notebook.py::test_two_cards_from_a_notebook_kernel",
    "tests/test_plugin_behaviours.py::test_deepspeed_cpu_checkpointing_recomputes_from_a_cpu_copy",
    "tests/test_plugin_behaviours.py::test_deepspeed_fp16_trains_on_gaudi2",
    "tests/test_plugin_behaviours.py::test_deepspeed_init_inference_arguments_reach_the_inference_engine",
    "tests/test_plugin_behaviours.py::test_fsdp_cpu_offload_keeps_parameters_on_the_host_and_trains_the_same",
    "tests/test_plugin_behaviours_round2.py::test_hccl_reduces_with_product_on_the_device",
    "tests/test_profiler.py::test_import_order_does_not_matter",
    "tests/test_profiler.py::test_the_profiler_and_traces_import_no_notebook_layer",
    "tests/test_pytorch_lightning.py::test_a_fresh_python_that_never_imports_hpu_nb_builds_an_hpu_trainer",
    "tests/test_pytorch_lightning.py::test_after_import_torch_alone_torch_hpu_is_there_as_on_a_gaudi_and_the_device_waits_for_its_first_use",
    "tests/test_pytorch_lightning.py::test_the_autoload_can_be_switched_off",
    "tests/test_pytorch_lightning.py::test_torch_hpu_after_import_torch_follows_habana_s_autoload_rule",
    "tests/test_third_party_gaudi_code.py::test_a_model_references_script_that_imports_habana_first_trains_and_evaluates",
})


def unparametrized(nodeid: str) -> str:
    """The node id without its parameters."""
    return nodeid.split("[", 1)[0]


def mark_slow(items: list[pytest.Item]) -> None:
    for item in items:
        if unparametrized(item.nodeid) in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)


class MeasuredSlow:
    """A plugin (tests/conftest.py registers it): marks before `-m "not slow"` deselects (a conftest's own hook of
    that name runs after, for the xdist groups)."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        mark_slow(items)
