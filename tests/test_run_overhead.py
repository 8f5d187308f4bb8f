"""What `evolve run` does after its last generation stays cheap: the final table
comes from the population kernel (equal to the benchmark's compiled ufuncs) and
no picture is drawn until `evolve inspect` asks."""

import subprocess
import sys

from evolve.runs import report


def test_run_table_equals_benchmark_metrics(small_data_dir):
    bench = report.benchmark(small_data_dir, None, repeats=1)
    table = report.run_table(small_data_dir)
    assert set(table["splits"]) == set(bench["splits"])
    for split, body in bench["splits"].items():
        got = table["splits"][split]["heuristics"]
        assert set(got) == set(body["heuristics"])
        for name, m in body["heuristics"].items():
            assert got[name] == {k: v for k, v in m.items() if k != "eval_ms"}, (split, name)


def test_run_does_not_import_matplotlib_or_compile_baselines(tmp_path, small_data_dir):
    code = ("import sys\n"
            "from click.testing import CliRunner\n"
            "from evolve.cli import main\n"
            "from heuristics import registry\n"
            "seen = []\n"
            "real = registry.compile_function\n"
            "registry.compile_function = lambda fn: seen.append(fn.__name__) or real(fn)\n"
            f"r = CliRunner().invoke(main, ['run', '--generations', '1', '--population', '8', "
            f"'--data', {str(small_data_dir)!r}, '--runs-dir', {str(tmp_path)!r}, "
            "'--no-writeback'])\n"
            "assert r.exit_code == 0, r.output\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib')[:1],"
            " seen)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    assert out == "[] ['evolved']", out
