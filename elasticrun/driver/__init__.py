"""The launcher side: one asyncio process that never imports torch."""
