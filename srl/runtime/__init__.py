"""srl.runtime"""
