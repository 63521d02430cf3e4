"""srl.base"""
