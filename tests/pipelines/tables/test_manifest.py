"""The manifest's options (pipelines/tables/manifest.py manifest_options): pagemill's own options and the Beam
flags given, never Beam's other defaults nor a credential."""
from __future__ import annotations

from pipelines.config.options import PagemillOptions, own_option_names
from pipelines.tables.manifest import manifest_options

SECRET = "pagemill-test-secret-manifest"


def test_pagemill_options_and_the_beam_flags_given_only() -> None:
    options = PagemillOptions(["--input", "in/", "--output", "out/", "--dpi", "200", "--direct_num_workers", "3",
                               "--job_name", "nightly", "--s3_secret_access_key", SECRET,
                               f"--azure_connection_string=AccountName=a;AccountKey={SECRET}-azure"])
    recorded = manifest_options(options)
    assert len(recorded) <= 80, sorted(recorded)
    assert own_option_names() <= set(recorded)  # every pagemill option, defaults included
    assert (recorded["dpi"], recorded["direct_num_workers"], recorded["job_name"]) == (200, 3, "nightly")
    # Beam defaults that this run did not set: a Dataflow endpoint, a Flink master, the runner.
    assert not {"dataflow_endpoint", "flink_master", "runner", "direct_running_mode"} & set(recorded)
    assert SECRET not in repr(recorded) and "s3_secret_access_key" not in recorded
    assert "azure_connection_string" not in recorded  # it carries the storage account's key
    # Beam has far more options than the manifest records.
    assert len(options.get_all_options(drop_default=False)) > 2 * len(recorded)


def test_passwords_in_urls_are_not_recorded() -> None:
    options = PagemillOptions(["--input", "s3://in/", "--input", "https://tok3n-abc@files.example.com/in/",
                               "--output", "out/", "--engine", "openai", "--model", "m",
                               "--endpoint", f"http://pagemill:{SECRET}@gpu-7:8000/v1"])
    recorded = manifest_options(options)
    assert recorded["endpoint"] == "http://pagemill:***@gpu-7:8000/v1"  # whose, and where: kept
    assert recorded["input"] == ["s3://in/", "https://***@files.example.com/in/"]  # a lone user part may be a key
    assert SECRET not in repr(recorded) and "tok3n" not in repr(recorded)
