"""`meshplan plan ... --launch-dir DIR --launcher torchrun|slurm` writes the launch scripts."""

import subprocess

import meshplan as mp
from meshplan.cli import main

ARGS = ["plan", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--nodes", "2",
        "--global-batch", "64", "--seq-len", "2048", "--top-k", "2", "--quiet"]


def test_plan_writes_launch_scripts(tmp_path, capsys):
    d = tmp_path / "launch"
    assert main(ARGS + ["--launch-dir", str(d), "--launcher", "slurm"]) == 0
    assert "launch script written to" in capsys.readouterr().out
    script = d / "run_slurm.sbatch"
    plan = mp.Plan.from_json(d / "plan.json")
    text = script.read_text()
    gpus = plan.best.layout.num_gpus
    assert f"#SBATCH --nodes={-(-gpus // 8)}" in text and "##SBATCH --account=" in text
    subprocess.run(["bash", "-n", str(script)], check=True)
    # an existing script is refused before the search, and kept
    before = script.read_text()
    assert main(ARGS + ["--launch-dir", str(d), "--launcher", "slurm"]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert script.read_text() == before
    assert main(ARGS + ["--launch-dir", str(d), "--launcher", "torchrun", "--force"]) == 0
    assert "MASTER_ADDR" in (d / "run_torchrun.sh").read_text()
