"""operate"""
