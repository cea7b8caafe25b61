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

    let stats_file = prefix.join("exit-stats.json");
    let out = run_ok(
        fake_cudart::command(&program)
            .arg(env!("CARGO_PKG_VERSION"))
            .env(
                "CACHEALLOC_CONF",
                format!("stats:json,stats_file:{}", stats_file.display()),
            )
            .env_remove("CACHEALLOC_DISABLE"),
    );
    assert!(
        stdout(&out).contains("ok c_api"),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    // A device the process does not have is named with the ones it has (the fake runtime has
    // two); a negative one without asking the runtime.
    let log = stderr(&out);
    assert!(
        log.contains("cachealloc_malloc: no device 7 in this process (it has 2: devices 0 to 1)"),
        "{log}"
    );
    assert!(
        log.contains("cachealloc_malloc: no device -1 in this process\n"),
        "{log}"
    );
    // cachealloc_stats_json answers 0 for any failure: the log says which.
    assert!(
        log.contains("cachealloc_stats_json: no device 7 in this process (it has 2"),
        "{log}"
    );
    // The devices that served allocations, and not the missing ones the program asked for.
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats_file).unwrap()).unwrap();
    let devices: Vec<i64> = stats["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["device"].as_i64().unwrap())
        .collect();
    assert_eq!(devices, [0, 1], "{stats}");

    // The README's link order serves the program's own cudaMalloc from the pool too; with
    // -lcudart first it stays on the runtime.
    let source = prefix.join("link_order.c");
    std::fs::write(
        &source,
        "#include <stdio.h>\n#include <cachealloc.h>\n#include <cuda_runtime_api.h>\n\
         int main(void) { void *p; CacheallocStats s; s.size = sizeof s;\n\
         if (cudaMalloc(&p, 1 << 20) != 0 || cachealloc_get_stats(0, &s) != 0) return 1;\n\
         printf(\"pooled %llu\\n\", (unsigned long long)s.allocations);\n\
         return cudaFree(p); }\n",
    )
    .unwrap();
    let fake = fake_cudart::fake_cudart();
    let cudart_first: Vec<String> = ["-L".to_string(), fake.lib_dir.display().to_string()]
        .into_iter()
        .chain(["-lcudart".to_string()])
        .chain(args.iter().map(|a| a.to_string()))
        .collect();
    let cudart_first: Vec<&str> = cudart_first.iter().map(String::as_str).collect();
    // As the README writes it: -lcudart kept although every symbol the program uses binds
    // before it.
    let readme: Vec<&str> = args.iter().copied().chain(["-Wl,--no-as-needed"]).collect();
    for (name, link_args, pooled) in [
        ("link_order_readme", &readme[..], "pooled 1"),
        ("link_order_cudart_first", &cudart_first[..], "pooled 0"),
    ] {
        let program = fake_cudart::compile_c_program(&source, name, link_args);
        let out = run_ok(fake_cudart::command(&program).env_remove("CACHEALLOC_CONF"));
        assert_eq!(stdout(&out).trim(), pooled, "{name}: {}", stderr(&out));
    }

    // Linked without its --no-as-needed, the unused -lcudart is dropped: no runtime in the
    // process. Every call answers 3 with a warning that says why (disabled too, though the
    // library logs nothing else then), a free of NULL answers 0, and the interposed calls (the
    // library's exports, linked before the runtime) say the same and leave 3 as the last error,
    // as a failed runtime call does, whether the library serves them or only forwards them.
    let source = prefix.join("no_runtime.c");
    std::fs::write(
        &source,
        "#include <stdio.h>\n#include <cachealloc.h>\n#include <cuda_runtime_api.h>\n\
         int main(void) { void *p = NULL; int c[8];\n\
         c[0] = cachealloc_malloc(&p, 1 << 20, 0, NULL); c[1] = cachealloc_free(NULL);\n\
         c[2] = cudaMalloc(&p, 1 << 20); c[3] = cudaGetLastError(); c[4] = cudaGetLastError();\n\
         c[5] = cudaDeviceSynchronize(); c[6] = cudaPeekAtLastError(); c[7] = cudaGetLastError();\n\
         printf(\"%d %d %d %d %d %d %d %d\\n\", c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]);\n\
         return 0; }\n",
    )
    .unwrap();
    let as_needed: Vec<&str> = ["-Wl,--as-needed"]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    let program = fake_cudart::compile_c_program(&source, "no_runtime", &as_needed);
    for disable in ["0", "1"] {
        let out = run_ok(
            fake_cudart::command(&program)
                .env_remove("CACHEALLOC_CONF")
                .env("CACHEALLOC_DISABLE", disable),
        );
        assert_eq!(
            stdout(&out).trim(),
            "3 0 3 3 0 3 3 3",
            "CACHEALLOC_DISABLE={disable}: {}",
            stderr(&out)
        );
        // Disabled too: the program cannot run, and is told once.
        assert_eq!(
            stderr(&out)
                .matches("no CUDA runtime found in this process")
                .count(),
            1,
            "CACHEALLOC_DISABLE={disable}: {}",
            stderr(&out)
        );
    }

    // Disabled, the library serves nothing, and its statistics say so as a pool that has done
    // nothing does: no limit on splitting (-1), not a limit of 0 bytes. Its allocations are the
    // runtime's, on the device asked for, and the program's current device stays as it was; a
    // failure is reported by its code only, as when enabled: neither the library's cudaSetDevice
    // to a device the process does not have nor the runtime's refusal of a free is left as the
    // program's last error, and an error the program has not read stays. Recording a stream
    // does nothing.
    let source = prefix.join("disabled_stats.c");
    std::fs::write(
        &source,
        "#include <stdio.h>\n#include <cachealloc.h>\n#include <fakecudart.h>\n\
         int main(void) { char json[16384]; void *p, *q; int current = -1;\n\
         int rc = cachealloc_malloc(&p, 1 << 20, 0, NULL);\n\
         if (rc != 0) { printf(\"malloc answered %d\\n\", rc); return 1; }\n\
         if (cachealloc_stats_json(0, json, sizeof json) >= sizeof json) return 2;\n\
         if (cachealloc_malloc(&q, 1 << 20, 1, NULL) != 0) return 3;\n\
         if (fakecudart_device_bytes_in_use(1) != 1 << 20) return 4;\n\
         if (cudaGetDevice(&current) != 0 || current != 0) return 5;\n\
         if (cachealloc_free(q) != 0 || fakecudart_device_bytes_in_use(1) != 0) return 6;\n\
         if (cachealloc_malloc(&q, 4096, 7, NULL) != 101 || cudaGetLastError() != 0) return 7;\n\
         if (cudaSetDevice(99) != 101 || cachealloc_free(&current) != 1) return 8;\n\
         if (cudaGetLastError() != 101 || cudaGetLastError() != 0) return 9;\n\
         if (cachealloc_record_stream(p, (void *)0x1000) != 0) return 10;\n\
         puts(json); return cachealloc_free(p); }\n",
    )
    .unwrap();
    let program = fake_cudart::compile_c_program(&source, "disabled_stats", &readme);
    let out = run_ok(
        fake_cudart::command(&program)
            .env_remove("CACHEALLOC_CONF")
            .env("CACHEALLOC_DISABLE", "1"),
    );
    let stats: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(stats["max_split_size"], -1, "{stats}");
    assert_eq!(stats["allocation.all.current"], 0, "{stats}");
    let _ = std::fs::remove_dir_all(&prefix);
    assert!(Path::new(&program).is_file());
}

/// `install.sh` reads its arguments as an install script is expected to: a relative prefix (and
/// a relative `CACHEALLOC_LIBRARY`) from the directory it is run in, an empty prefix (an unset
/// variable) or an unknown option refused without installing anything, and a prefix that
/// pkg-config's flags could not name refused with the reason.
#[test]
fn install_script_takes_paths_from_the_callers_directory_and_refuses_bad_prefixes() {
    let work = std::env::temp_dir().join(format!("cachealloc-install-args-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(work.join("built")).unwrap();
    std::fs::copy(library(), work.join("built/libcachealloc.so")).unwrap();
    let script = root().join("scripts/install.sh");
    let install = |args: &[&str]| {
        Command::new("bash")
            .arg(&script)
            .args(args)
            .current_dir(&work)
            .env("CACHEALLOC_LIBRARY", "built/libcachealloc.so")
            .output()
            .expect("bash runs")
    };

    let out = install(&["prefix"]);
    assert!(out.status.success(), "{}", stderr(&out));
    for file in [
        "lib/libcachealloc.so",
        "include/cachealloc.h",
        "lib/pkgconfig/cachealloc.pc",
    ] {
        assert!(
            work.join("prefix").join(file).is_file(),
            "{file} not installed"
        );
    }
    let pc = std::fs::read_to_string(work.join("prefix/lib/pkgconfig/cachealloc.pc")).unwrap();
    assert!(
        pc.contains(&format!("prefix={}\n", work.join("prefix").display())),
        "{pc}"
    );

    let spaced = work.join("my prefix");
    for (args, says) in [
        (vec![""], "PREFIX is empty"),
        (vec!["--prefix"], "unknown option '--prefix'"),
        (vec!["a", "b"], "one PREFIX at most"),
        (vec![spaced.to_str().unwrap()], "contains whitespace"),
        (vec!["x#y"], "contains whitespace or one of #"),
    ] {
        let out = install(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
    assert!(!spaced.exists() && !work.join("x#y").exists());
    assert!(install(&["--help"]).status.success());
    let _ = std::fs::remove_dir_all(&work);
}
