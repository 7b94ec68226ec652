"""The server unit under systemd (or docker-systemctl-replacement): ``control`` talks to
systemctl and journalctl, ``install`` renders and installs the units."""
