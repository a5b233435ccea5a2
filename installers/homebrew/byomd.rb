# Homebrew formula template for byomd on macOS, written out with its version
# by installers/release.sh. Fill in the source tarball's URL and SHA-256 for
# your release (macOS binaries are built from source: Apple's toolchain does
# not cross-build from Linux), then `brew install --formula ./byomd.rb`.
# Pair with `byomd pair TOKEN`; `brew services start byomd` keeps it running.
class Byomd < Formula
  desc "byom endpoint daemon: runs the byom agent's commands on this Mac"
  homepage "https://github.com/byom-dev/byom"
  url "@SOURCE_URL@"
  sha256 "@SOURCE_SHA256@"
  version "@VERSION@"
  license "Apache-2.0"

  depends_on "rust" => :build

  def install
    system "cargo", "install", *std_cargo_args(path: "endpoint-daemon")
    # Made by byomd from its own command-line definitions.
    generate_completions_from_executable(bin/"byomd", "completions")
    system bin/"byomd", "man", "--dir", buildpath/"man"
    man1.install Dir[buildpath/"man/*.1"]
  end

  service do
    run [opt_bin/"byomd", "run"]
    keep_alive true
    log_path var/"log/byomd.log"
    error_log_path var/"log/byomd.log"
  end

  test do
    assert_match version.to_s, shell_output("#{bin}/byomd --version")
  end
end
