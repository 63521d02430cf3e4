"""srl.system"""
