//! The install story: `scripts/install.sh PREFIX` puts the library, the header and a pkg-config
//! file into PREFIX, and a C program built with `pkg-config --cflags --libs cachealloc` uses the
//! C API against the fake runtime. The test installs the library of this build
//! (`CACHEALLOC_LIBRARY`) instead of building a release one. Skipped with a message when
//! `pkg-config` is missing.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use support::fake_cudart;
use support::shim::{library, run_ok, stderr, stdout};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn installed_library_links_with_pkg_config_and_serves_the_c_api() {
    if Command::new("pkg-config")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipping: pkg-config not found (apt-get install pkg-config)");
        return;
    }
    let prefix = std::env::temp_dir().join(format!("cachealloc-install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&prefix);
    run_ok(
        Command::new("bash")
            .arg(root().join("scripts/install.sh"))
            .arg(&prefix)
            .env("CACHEALLOC_LIBRARY", library()),
    );
    for file in [
        "lib/libcachealloc.so",
        "include/cachealloc.h",
        "lib/pkgconfig/cachealloc.pc",
    ] {
        assert!(prefix.join(file).is_file(), "{file} not installed");
    }

    let flags = run_ok(
        Command::new("pkg-config")
            .args(["--cflags", "--libs", "cachealloc"])
            .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig")),
    );
    let flags = stdout(&flags);
    assert!(flags.contains("-lcachealloc"), "{flags}");
    let mut args: Vec<String> = flags.split_whitespace().map(str::to_string).collect();
    args.push(format!("-Wl,-rpath,{}", prefix.join("lib").display()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let program = fake_cudart::compile_c_program(
        &root().join("tests/preload/c_api_check.c"),
        "c_api_check",
        &args,
    );

    let out = run_ok(
        fake_cudart::command(&program)
            .arg(env!("CARGO_PKG_VERSION"))
            .env_remove("CACHEALLOC_CONF")
            .env_remove("CACHEALLOC_DISABLE"),
    );
    assert!(
        stdout(&out).contains("ok c_api"),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    let _ = std::fs::remove_dir_all(&prefix);
    assert!(Path::new(&program).is_file());
}
