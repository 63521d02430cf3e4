"""srl.nets"""
