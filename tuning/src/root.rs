//! The machine as the tuners see it: every path a tuner names is absolute
//! (`/proc/sys/vm/swappiness`) and is read and written under the root
//! directory. On a host the root is `/`; tests build a fake tree of the
//! files a tuner reads in a temporary directory and pass that.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The directory every absolute path is taken under.
#[derive(Debug, Clone)]
pub struct Root {
    dir: PathBuf,
}

impl Root {
    pub fn new(dir: impl Into<PathBuf>) -> Root {
        let dir = dir.into();
        // A relative `--root` is resolved once, so that paths read back
        // from symlinks can be compared with it.
        let dir = fs::canonicalize(&dir).unwrap_or(dir);
        Root { dir }
    }

    /// Whether this is the machine itself (`/`): only then is an io_uring
    /// probe, a process limit or a file system's free space about it.
    pub fn is_live(&self) -> bool {
        self.dir == Path::new("/")
    }

    /// Where an absolute path lies on this machine.
    pub fn path(&self, abs: impl AsRef<Path>) -> PathBuf {
        let abs = abs.as_ref();
        self.dir.join(abs.strip_prefix("/").unwrap_or(abs))
    }

    /// `abs` as a command run on this machine would name it.
    pub fn display(&self, abs: &str) -> String {
        self.path(abs).display().to_string()
    }

    /// The file's contents, trimmed; `None` when it cannot be read.
    pub fn read(&self, abs: impl AsRef<Path>) -> Option<String> {
        fs::read_to_string(self.path(abs)).ok().map(|s| s.trim().to_string())
    }

    /// A sysctl by its dotted name (`vm.swappiness`), trimmed.
    pub fn sysctl(&self, name: &str) -> Option<String> {
        self.read(sysctl_path(name))
    }

    pub fn exists(&self, abs: impl AsRef<Path>) -> bool {
        self.path(abs).exists()
    }

    pub fn write(&self, abs: &str, value: &str) -> io::Result<()> {
        fs::write(self.path(abs), value)
    }

    pub fn create_dir(&self, abs: &str) -> io::Result<()> {
        fs::create_dir_all(self.path(abs))
    }

    /// The names in a directory, sorted; empty when it cannot be read.
    pub fn list(&self, abs: impl AsRef<Path>) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(self.path(abs))
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// The absolute path (seen from the root) that `abs` resolves to, every
    /// symlink followed: `/sys/dev/block/8:1` → `/sys/devices/…/sda/sda1`.
    /// `None` when it does not exist or resolves outside the root.
    pub fn resolve(&self, abs: impl AsRef<Path>) -> Option<PathBuf> {
        let real = fs::canonicalize(self.path(abs)).ok()?;
        let inside = real.strip_prefix(&self.dir).ok()?;
        Some(Path::new("/").join(inside))
    }

    /// Free and total bytes of the file system holding `abs`.
    pub fn space(&self, abs: impl AsRef<Path>) -> io::Result<(u64, u64)> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(self.path(abs).as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))?;
        // SAFETY: a zeroed statvfs is a valid out-parameter; `path` is a
        // NUL-terminated string that outlives the call.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let unit = st.f_frsize as u64;
        Ok((st.f_bavail as u64 * unit, st.f_blocks as u64 * unit))
    }
}

/// `/proc/sys/vm/swappiness` for `vm.swappiness`.
pub fn sysctl_path(name: &str) -> String {
    format!("/proc/sys/{}", name.replace('.', "/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_taken_under_the_root_and_resolved_back_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        assert!(!root.is_live());
        fs::create_dir_all(root.path("/sys/devices/disk/sda")).unwrap();
        fs::create_dir_all(root.path("/sys/dev/block")).unwrap();
        std::os::unix::fs::symlink("../../devices/disk/sda", root.path("/sys/dev/block/8:0")).unwrap();
        assert_eq!(
            root.resolve("/sys/dev/block/8:0"),
            Some(PathBuf::from("/sys/devices/disk/sda"))
        );
        assert_eq!(root.resolve("/sys/dev/block/9:9"), None);
        fs::create_dir_all(root.path("/proc/sys/vm")).unwrap();
        root.write("/proc/sys/vm/swappiness", "60\n").unwrap();
        assert_eq!(root.sysctl("vm.swappiness").as_deref(), Some("60"));
        assert_eq!(root.list("/sys/dev/block"), vec!["8:0".to_string()]);
        assert!(Root::new("/").is_live());
    }
}
