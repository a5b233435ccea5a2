# Installs byomd as a Windows service (run in an elevated PowerShell); this
# is what `byomd service install` runs on Windows. Logs: Windows Event Log.
param([string]$Command = '"{{BYOMD}}" run')
$ErrorActionPreference = "Stop"
New-Service -Name "byomd" -DisplayName "byom endpoint daemon" -BinaryPathName $Command -StartupType Automatic
sc.exe failure byomd reset= 300 actions= restart/2000/restart/2000/restart/10000 | Out-Null
Start-Service byomd
