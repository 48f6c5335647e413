"""hpcdp submits through three non-public submitit hooks (hpcdp/submit.py). If a submitit release
renames or reshapes them, this fails loudly here, and `hpcdp submit` says so in one line."""

from __future__ import annotations

import pytest
import submitit

from hpcdp import submit
from hpcdp.errors import UsageError


def test_the_installed_submitit_has_the_hooks_the_adapter_uses():
    submit.check_submitit_hooks(submitit.SlurmExecutor)  # raises if they changed
    assert issubclass(submit._executor_class(), submitit.SlurmExecutor)


def test_the_rendered_text_is_what_submitit_would_write(tmp_path):
    executor = submit._executor_class()(tmp_path, "#!/bin/bash\n#SBATCH --nodes=2\ntrue\n", [])
    assert executor._make_submission_file_text("ignored", "uid") == (
        "#!/bin/bash\n#SBATCH --nodes=2\ntrue\n")
    assert executor._make_submission_command(tmp_path / "job.sh") == [
        "sbatch", str(tmp_path / "job.sh")]


def test_a_dependency_goes_on_sbatchs_command_line_not_into_the_script(tmp_path):
    options = ["--dependency=afterok:42", "--kill-on-invalid-dep=yes"]
    executor = submit._executor_class()(tmp_path, "#!/bin/bash\ntrue\n", options)
    assert executor._make_submission_command(tmp_path / "job.sh") == [
        "sbatch", *options, str(tmp_path / "job.sh")]
    assert "dependency" not in executor._make_submission_file_text("ignored", "uid")


def test_a_changed_hook_is_one_clear_error():
    class Changed(submitit.SlurmExecutor):
        def _submit_command(self, command, extra):  # a hypothetical new signature
            return None

    with pytest.raises(UsageError, match=r"changed Changed._submit_command.*submitit>=1.5,<1.6"):
        submit.check_submitit_hooks(Changed)
