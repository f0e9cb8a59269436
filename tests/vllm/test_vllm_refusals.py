"""What FeatherScheduler refuses (at construction, with the flag to change) and how vLLM finds the class."""

import dataclasses
import subprocess
import sys

import pytest
import vllm
from vllm.config import KVTransferConfig, SchedulerConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.import_utils import resolve_obj_by_qualname
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request
from vllm_harness import EngineShape, make_scheduler, vllm_config

from sglang_feather.admission import ConfigError
from sglang_feather.vllm import FeatherScheduler, UnsupportedVllmConfig, UnsupportedVllmVersion
from sglang_feather.vllm.config import SUPPORTED_VLLM_MINORS, check_vllm_version

pytestmark = pytest.mark.vllm


def _async(config):
    config.scheduler_config.async_scheduling = True  # vLLM's default on GPU; the CPU platform turns it off


def _kv_connector(config):
    config.kv_transfer_config = KVTransferConfig(kv_connector="ExampleConnector", kv_role="kv_both")


def _pipeline(config):
    config.parallel_config.pipeline_parallel_size = 2


SINCE_034 = ("cache_aware_admission_window", "max_num_inflight_kv_loads")
"""SchedulerConfig fields vLLM 0.34 added that Feather refuses; the 0.32 and 0.33 venvs have neither."""
HAS_034_FIELDS = {name: name in {f.name for f in dataclasses.fields(SchedulerConfig)} for name in SINCE_034}


def _cache_aware(config):
    config.scheduler_config.cache_aware_admission_window = 8


def _inflight_kv_loads(config):
    config.scheduler_config.max_num_inflight_kv_loads = 4


CASES = [
    ("async", EngineShape(), _async, "--no-async-scheduling"),
    ("priority", EngineShape(policy="priority"), None, "--scheduling-policy fcfs"),
    ("no-prefix-caching", EngineShape(enable_prefix_caching=False), None, "--enable-prefix-caching"),
    ("kv-connector", EngineShape(), _kv_connector, "kv_holding_waiting"),
    ("pipeline-parallel", EngineShape(), _pipeline, "--pipeline-parallel-size 1"),
]
if HAS_034_FIELDS["cache_aware_admission_window"]:
    CASES.append(("cache-aware", EngineShape(), _cache_aware, "--cache-aware-admission-window"))
if HAS_034_FIELDS["max_num_inflight_kv_loads"]:
    CASES.append(("inflight-kv-loads", EngineShape(), _inflight_kv_loads, "--max-num-inflight-kv-loads"))


def test_the_refused_034_options_exist_exactly_from_vllm_034():
    """So the 0.34 cases above cannot drop out of the 0.34 run unnoticed."""
    since_034 = not vllm.__version__.startswith(("0.32.", "0.33."))
    assert HAS_034_FIELDS == dict.fromkeys(SINCE_034, since_034)


@pytest.mark.parametrize(("shape", "mutate", "hint"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_unsupported_features_are_refused_at_construction(shape, mutate, hint):
    config = vllm_config(shape)
    if mutate is not None:
        mutate(config)
    with pytest.raises(UnsupportedVllmConfig, match=hint):
        make_scheduler(FeatherScheduler, shape, config=config)


def test_every_refused_feature_is_named_at_once():
    shape = EngineShape(policy="priority", enable_prefix_caching=False)
    config = vllm_config(shape)
    _async(config)
    with pytest.raises(UnsupportedVllmConfig) as info:
        make_scheduler(FeatherScheduler, shape, config=config)
    assert [line.split("]")[0] for line in str(info.value).splitlines()[1:]] == [
        "[async_scheduling",
        "[priority_policy",
        "[prefix_caching_off",
    ]


def test_the_same_configuration_is_fine_for_vllms_own_scheduler():
    shape = EngineShape(policy="priority", enable_prefix_caching=False)
    assert isinstance(make_scheduler(Scheduler, shape), Scheduler)


@pytest.mark.parametrize(
    ("section", "error", "match"),
    [
        ({"chunk_size": 64}, ValueError, "chunk_size is always vLLM's block size"),
        ({"stoper": "ucb"}, ValueError, "valid keys: stopper, stopper_options"),
        ({"stopper": "nope"}, ConfigError, r'additional_config\["feather"\]\["stopper"\] must be one of'),
        (
            {"stopper": "static", "stopper_options": {"max_chunk_loss": -1}},
            ConfigError,
            r'additional_config\["feather"\]\["stopper_options"\] do not fit .*max_chunk_loss',
        ),
        ({"max_wait_s": 0}, ConfigError, r'additional_config\["feather"\]\["max_wait_s"\] must be'),
        ({"max_wait_s": "300"}, ConfigError, r'\["max_wait_s"\] must be a finite number of seconds'),
        ({"defer_uncached_prefix": "off"}, ConfigError, r'\["defer_uncached_prefix"\] must be on or off'),
    ],
)
def test_bad_feather_options_are_refused_with_the_valid_choices(section, error, match):
    with pytest.raises(error, match=match):
        make_scheduler(FeatherScheduler, EngineShape(feather=section))


def test_a_feather_section_that_is_not_an_object_is_refused():
    config = vllm_config(EngineShape())
    config.additional_config = {"feather": "ucb"}
    with pytest.raises(ValueError, match="must be a JSON object"):
        make_scheduler(FeatherScheduler, EngineShape(), config=config)


def test_streaming_input_sessions_are_refused_and_leave_no_trace():
    scheduler = make_scheduler(FeatherScheduler, EngineShape())
    request = Request("s", list(range(40)), SamplingParams(max_tokens=2), None, resumable=True)
    with pytest.raises(ValueError, match="streaming-input"):
        scheduler.add_request(request)
    assert not scheduler.requests and not scheduler.waiting and len(scheduler.admission.tree) == 0


def test_vllm_resolves_the_dotted_name_and_importing_the_package_does_not_import_vllm():
    assert resolve_obj_by_qualname("sglang_feather.vllm.FeatherScheduler") is FeatherScheduler
    assert issubclass(FeatherScheduler, Scheduler)
    # The lazy half (the attribute imports vLLM) is the resolution above; a fresh process checks the eager
    # half without importing vLLM itself (that import costs 15-25 CPU-seconds per venv).
    probe = "import sys, sglang_feather.vllm; assert 'vllm' not in sys.modules, 'eager vllm import'"
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=300)


def test_this_run_tests_the_expected_supported_vllm(expected_vllm_version):
    assert vllm.__version__.rsplit(".", 1)[0] in SUPPORTED_VLLM_MINORS, vllm.__version__
    if expected_vllm_version is not None:
        assert vllm.__version__ == expected_vllm_version


@pytest.mark.parametrize("version", ["0.31.2", "0.35.0", "1.0.0", "0.3.3"])
def test_an_unsupported_vllm_version_is_refused_naming_the_supported_ones(version):
    with pytest.raises(
        UnsupportedVllmVersion, match=r"supports vLLM 0\.32\.x, 0\.33\.x and 0\.34\.x, but vLLM " + version
    ):
        check_vllm_version(version)


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu", "0.33.0", "0.33.1", "0.34.0"])
def test_supported_vllm_versions_pass(version):
    check_vllm_version(version)


def test_the_scheduler_checks_the_installed_version_at_construction(monkeypatch):
    monkeypatch.setattr(vllm, "__version__", "0.35.0")
    with pytest.raises(UnsupportedVllmVersion, match='pip install "vllm>=0.32,<0.35"'):
        make_scheduler(FeatherScheduler, EngineShape())
