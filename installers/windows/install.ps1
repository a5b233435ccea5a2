# byom's one-line installer for Windows, served by a byom server at
# /install.ps1 with its address, certificate pin and manifest hash filled
# in; `byom token create` prints the line that loads it and calls
# Install-Byomd. The same checks as install.sh: the CA against the token,
# the manifest against the hash the server signed, byomd.exe against the
# manifest. Then byomd.exe goes to %LOCALAPPDATA%\byom\bin, pairs, and is
# installed as a service (elevated) or started in the background.
# Needs TLS 1.3 (Windows 11, Server 2022), as the server speaks nothing older.

$ByomBase = '@BYOM_BASE_URL@'
$ByomCertSha256 = '@BYOM_CERT_SHA256@'
$ByomManifestSha256 = '@BYOM_MANIFEST_SHA256@'
$ByomVersion = '@BYOM_VERSION@'

function Get-Sha256Hex([byte[]]$Bytes) {
    ([BitConverter]::ToString([Security.Cryptography.SHA256]::Create().ComputeHash($Bytes)) -replace '-', '').ToLower()
}

function Install-Byomd {
    param([Parameter(Mandatory = $true)][string]$Token, [string]$Name = '', [switch]$Uninstall)
    $ErrorActionPreference = 'Stop'
    $bin = Join-Path $env:LOCALAPPDATA 'byom\bin'
    $exe = Join-Path $bin 'byomd.exe'
    if ($Uninstall) {
        if (Test-Path $exe) {
            & $exe service uninstall 2>$null
            & $exe unpair --force
            Remove-Item $exe
        }
        Write-Host "byom: uninstalled byomd"
        return
    }
    if (-not $Token.StartsWith('byom1-')) { throw "byom: not a pairing token (it starts with byom1-)" }
    $b64 = $Token.Substring(6).Replace('_', '/').Replace('-', '+')
    switch ($b64.Length % 4) { 2 { $b64 += '==' } 3 { $b64 += '=' } }
    $raw = [Convert]::FromBase64String($b64)
    $wantCa = (($raw[0..31] | ForEach-Object { $_.ToString('x2') }) -join '')

    [Net.ServicePointManager]::ServerCertificateValidationCallback = {
        param($s, $c) ([BitConverter]::ToString([Security.Cryptography.SHA256]::Create().ComputeHash($c.GetRawCertData())) -replace '-', '') -eq $ByomCertSha256
    }
    $web = New-Object Net.WebClient
    $caPem = $web.DownloadString("$ByomBase/ca.pem")
    $caDer = [Convert]::FromBase64String((($caPem -split "`n") | Where-Object { $_ -notmatch '-----' }) -join '')
    $gotCa = Get-Sha256Hex $caDer
    if ($gotCa -ne $wantCa) { throw "byom: refusing to install: the server's CA has SHA-256 $gotCa but the token pins $wantCa" }

    # From here on the server's chain must lead to that CA.
    $ca = New-Object Security.Cryptography.X509Certificates.X509Certificate2 (, $caDer)
    [Net.ServicePointManager]::ServerCertificateValidationCallback = {
        param($s, $c, $chain)
        $ch = New-Object Security.Cryptography.X509Certificates.X509Chain
        $ch.ChainPolicy.RevocationMode = 'NoCheck'
        $ch.ChainPolicy.VerificationFlags = 'AllowUnknownCertificateAuthority'
        $ch.ChainPolicy.ExtraStore.Add($ca) | Out-Null
        $ch.Build($c) -and $ch.ChainElements[$ch.ChainElements.Count - 1].Certificate.Thumbprint -eq $ca.Thumbprint
    }.GetNewClosure()
    $manifest = $web.DownloadData("$ByomBase/manifest")
    $got = Get-Sha256Hex $manifest
    if ($got -ne $ByomManifestSha256) { throw "byom: refusing to install: the manifest has SHA-256 $got, not the $ByomManifestSha256 the server signed" }
    $line = ([Text.Encoding]::UTF8.GetString($manifest) -split "`n") | Where-Object { $_ -match '^artifact \S+ byomd windows x86_64 exe ' } | Select-Object -First 1
    if (-not $line) { throw "byom: the server ships no byomd for windows/x86_64" }
    $f = $line.Trim() -split ' '
    $bytes = $web.DownloadData("$ByomBase/dist/$($f[1])")
    $got = Get-Sha256Hex $bytes
    if ($got -ne $f[7]) { throw "byom: refusing to install: $($f[1]) has SHA-256 $got but the signed manifest says $($f[7])" }
    New-Item -ItemType Directory -Force -Path $bin | Out-Null
    [IO.File]::WriteAllBytes("$exe.new", $bytes)
    Move-Item -Force "$exe.new" $exe
    Write-Host "byom: installed byomd $ByomVersion to $exe"
    if ($Name) { & $exe pair $Token --name $Name } else { & $exe pair $Token }
    & $exe service install
    if ($LASTEXITCODE -ne 0) {
        Start-Process -WindowStyle Hidden -FilePath $exe -ArgumentList 'run'
        Write-Host "byom: started byomd in the background (not elevated: no service)"
    }
    & $exe status
}
