//! Whether io_uring works here: every shard's disk and network I/O goes
//! through its own ring, so a broker without it does not start.

use super::write_fix;
use crate::{Finding, Fix, Probe, Root};

/// glommio, the shards' runtime, needs Linux 5.8 or newer.
const KERNEL_MIN: (u32, u32) = (5, 8);

pub fn findings(root: &Root, probe: &Probe) -> Vec<Finding> {
    let probed = match probe {
        Probe::Live => Some(create_ring()),
        Probe::Given(outcome) => Some(outcome.clone()),
        Probe::Skipped => None,
    };
    vec![
        kernel(root),
        enabled(root),
        seccomp(root, probed.as_ref()),
        probe_ring(probed.as_ref()),
    ]
}

fn kernel(root: &Root) -> Finding {
    let release = root.read("/proc/sys/kernel/osrelease");
    let version = release.as_deref().and_then(parse_release);
    Finding {
        name: "io_uring_kernel",
        why: "glommio, the shards' io_uring runtime, needs Linux 5.8 or newer",
        current: release
            .clone()
            .unwrap_or_else(|| "unknown (/proc/sys/kernel/osrelease unreadable)".into()),
        recommended: format!("≥ {}.{}", KERNEL_MIN.0, KERNEL_MIN.1),
        pass: version.is_some_and(|v| v >= KERNEL_MIN),
        required: true,
        fix: Fix::Manual("upgrade the kernel".into()),
    }
}

/// `6.1.0-18-amd64` → (6, 1).
fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

fn enabled(root: &Root) -> Finding {
    let value = root.sysctl("kernel.io_uring_disabled");
    let pass = value.as_deref().is_none_or(|v| v == "0");
    Finding {
        name: "io_uring_enabled",
        why: "kernel.io_uring_disabled 1 or 2 refuses io_uring to the broker (Linux 6.6+)",
        current: match value {
            Some(v) => format!("kernel.io_uring_disabled = {v}"),
            None => "no kernel.io_uring_disabled (this kernel always allows io_uring)".into(),
        },
        recommended: "kernel.io_uring_disabled = 0".into(),
        pass,
        required: true,
        fix: write_fix(pass, crate::root::sysctl_path("kernel.io_uring_disabled"), "0".into()),
    }
}

fn seccomp(root: &Root, probed: Option<&Result<(), String>>) -> Finding {
    let status = root.read("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    let mode = field("Seccomp:");
    let filters = field("Seccomp_filters:").unwrap_or_else(|| "?".into());
    let (current, pass) = match mode.as_deref() {
        Some("0") => ("no seccomp filter".to_string(), true),
        Some(m) => {
            let allowed = probed.is_some_and(|p| p.is_ok());
            let verdict = match probed {
                Some(Ok(())) => "it allows io_uring (probe)",
                Some(Err(_)) => "it may be what refuses io_uring (probe failed)",
                None => "it may block io_uring (not probed)",
            };
            (format!("seccomp mode {m}, {filters} filter(s): {verdict}"), allowed)
        }
        None => ("unknown (/proc/self/status unreadable)".to_string(), false),
    };
    Finding {
        name: "io_uring_seccomp",
        why: "container runtimes' default seccomp profiles (Docker 25+) block io_uring_setup",
        current,
        recommended: "no filter, or one that allows io_uring_setup/enter/register".into(),
        pass,
        required: false,
        fix: Fix::Manual(
            "run the broker outside the filter (a systemd unit on the host, or a container seccomp profile \
             that allows io_uring_setup, io_uring_enter and io_uring_register)"
                .into(),
        ),
    }
}

fn probe_ring(probed: Option<&Result<(), String>>) -> Finding {
    let (current, pass) = match probed {
        Some(Ok(())) => ("a ring was created".to_string(), true),
        Some(Err(e)) => (format!("io_uring_setup failed: {e}"), false),
        None => ("not probed (--root is not this machine)".to_string(), true),
    };
    Finding {
        name: "io_uring_probe",
        why: "the one test that settles it: create a ring the way a shard does",
        current,
        recommended: "a ring is created".into(),
        pass,
        required: true,
        fix: Fix::Manual("see io_uring_kernel, io_uring_enabled and io_uring_seccomp".into()),
    }
}

/// Creates and closes a 4-entry io_uring.
fn create_ring() -> Result<(), String> {
    // struct io_uring_params is 120 bytes; zeroed asks for defaults.
    let mut params = [0u8; 120];
    // SAFETY: io_uring_setup reads and fills the params buffer, which is
    // large enough for the kernel's struct and lives through the call.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4u32, params.as_mut_ptr()) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    // SAFETY: fd is the ring's descriptor, ours alone, closed once.
    unsafe { libc::close(fd as libc::c_int) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_parse_to_major_and_minor() {
        assert_eq!(parse_release("6.1.0-18-amd64"), Some((6, 1)));
        assert_eq!(parse_release("5.10.0"), Some((5, 10)));
        assert_eq!(parse_release("4.19"), Some((4, 19)));
        assert_eq!(parse_release("junk"), None);
        assert!((5, 10) >= KERNEL_MIN && (4, 19) < KERNEL_MIN && (5, 8) >= KERNEL_MIN);
    }

    #[test]
    fn this_machine_can_create_a_ring() {
        // CI and the dev box run the broker's tests here, so io_uring works.
        assert_eq!(create_ring(), Ok(()));
    }
}
