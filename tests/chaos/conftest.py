from tests.ssh.conftest import sshd  # noqa: F401  (the chaos job has an SSH host too)
