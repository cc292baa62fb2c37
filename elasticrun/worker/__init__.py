"""Code that runs inside training processes. Never imports aiohttp, paramiko or click."""
