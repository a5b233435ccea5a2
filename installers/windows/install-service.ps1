# Installs byomd as a Windows service (run in an elevated PowerShell).
param([string]$Binary = "$env:ProgramFiles\byom\byomd.exe")
$ErrorActionPreference = "Stop"
New-Service -Name "byomd" -DisplayName "byom endpoint daemon" `
  -BinaryPathName "`"$Binary`" run" -StartupType Automatic
sc.exe failure byomd reset= 300 actions= restart/2000/restart/2000/restart/10000 | Out-Null
Start-Service byomd
