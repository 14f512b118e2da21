"""Configuration: parsing, validation and the one-line errors users see."""

import pytest

from trainscale.config import Config, ConfigError, config_to_toml, load_config, read_toml


def test_defaults_are_valid_and_overrides_apply():
    cfg = load_config(["--model.name", "resnet18", "--strategy.bucket_mb", "0", "--strategy.overlap=false",
                       "--job.steps", "7"])
    assert (cfg.model.name, cfg.strategy.bucket_mb, cfg.strategy.overlap, cfg.job.steps) == ("resnet18", 0.0, False, 7)
    assert Config().strategy.bucket_mb == 25.0


def test_toml_then_cli_override(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text('[data]\nbatch_size = 16\nname = "synthetic"\n[strategy]\namp = "bf16"\n')
    cfg = load_config(["--data.batch_size", "8"], str(f))
    assert (cfg.data.batch_size, cfg.data.name, cfg.strategy.amp) == (8, "synthetic", "bf16")


def test_print_config_round_trips(tmp_path):
    cfg = load_config(["--optim.lr", "0.3", "--log.every", "3"])
    f = tmp_path / "out.toml"
    f.write_text(config_to_toml(cfg))
    again = load_config([], str(f))
    assert again == cfg


@pytest.mark.parametrize("argv, key, fragment", [
    (["--strategy.bucket_size", "3"], "strategy.bucket_size", "unknown field of [strategy]; did you mean strategy.bucket_mb? fields are name, bucket_mb"),
    (["--nosuch.x", "1"], "nosuch.x", "unknown section"),
    (["--job.steps", "ten"], "job.steps", "expected an integer"),
    (["--strategy.bucket_mb", "-1"], "strategy.bucket_mb", "must be a number >= 0"),
    (["--strategy.amp", "fp8"], "strategy.amp", "one of none, bf16, fp16"),
    (["--strategy.overlap", "maybe"], "strategy.overlap", "expected true or false"),
    (["--strategy.grad_accum", "0"], "strategy.grad_accum", "must be a number >= 1"),
])
def test_bad_values_name_field_value_and_accepted(argv, key, fragment):
    with pytest.raises(ConfigError) as e:
        load_config(argv)
    msg = str(e.value)
    assert msg.startswith(f"{key} = ") and fragment in msg and "\n" not in msg
    assert repr(argv[-1]) in msg or str(argv[-1]) in msg


def test_bad_toml_is_one_line(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("[model\nname = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        read_toml(f)
    with pytest.raises(ConfigError, match="no such file"):
        read_toml(tmp_path / "missing.toml")
    g = tmp_path / "type.toml"
    g.write_text("[job]\nsteps = \"many\"\n")
    with pytest.raises(ConfigError, match="job.steps = 'many': expected an integer"):
        load_config([], str(g))
