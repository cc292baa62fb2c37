"""Workers on other hosts over SSH (paramiko): connections, the remote bootstrap, the
process seen through its channel, and SSH hosts' agents."""
