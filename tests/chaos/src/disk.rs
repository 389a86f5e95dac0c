//! A file system of its own per node, so one node's disk can fill: an
//! ext4 image (sparse, [`IMAGE_BYTES`]) loop-mounted at the node's
//! directory, the node's data in `data/` inside it (tmpfs would be
//! simpler, but it does not take the O_DIRECT the segment writer uses).
//!
//! The `disk-full` fault allocates a ballast file (`fallocate`, chunks
//! halving down to one block) until the file system has no block left,
//! so the broker's own writes fail with ENOSPC, as when another program
//! fills a shared disk; the fault ends by deleting the ballast. The image
//! is made without reserved blocks (`-m 0`), so root's writes fail too.
//!
//! Used only when a run names `disk-full` (and runs as root). Every mount
//! and image is removed when [`Disks`] is dropped (after the nodes are
//! killed: the cluster drops it last).

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Each node's file system (sparse: it takes only what is written).
pub const IMAGE_BYTES: u64 = 2 << 30;

pub struct Disks {
    /// (image, mount point) of each node that has one.
    mounts: Vec<(PathBuf, PathBuf)>,
    /// Whether dropping leaves the images (see [`Disks::keep_images`]).
    keep_images: bool,
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

/// The directory a node keeps its data in, under its mount point (or its
/// directory, without a file system of its own).
pub fn data_dir(node_dir: &Path) -> PathBuf {
    node_dir.join("data")
}

impl Disks {
    /// Makes and mounts a file system at each of `node_dirs`.
    pub fn create(node_dirs: &[PathBuf]) -> Result<Disks, String> {
        let mut disks = Disks {
            mounts: Vec::new(),
            keep_images: false,
        };
        for dir in node_dirs {
            let image = dir.with_extension("img");
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let file = std::fs::File::create(&image).map_err(|e| format!("{}: {e}", image.display()))?;
            file.set_len(IMAGE_BYTES)
                .map_err(|e| format!("{}: {e}", image.display()))?;
            let (image_s, dir_s) = (image.display().to_string(), dir.display().to_string());
            run("mkfs.ext4", &["-q", "-F", "-m", "0", &image_s])?;
            run("mount", &["-o", "loop", &image_s, &dir_s])?;
            // From here on, Drop unmounts it.
            disks.mounts.push((image, dir.clone()));
        }
        Ok(disks)
    }

    /// Leaves the images (each node's data: `mount -o loop,ro N.img DIR`
    /// to look) in place when unmounted, for a run whose directory stays.
    pub fn keep_images(&mut self) {
        self.keep_images = true;
    }

    fn ballast(&self, node: u8) -> Option<PathBuf> {
        self.mounts
            .get(usize::from(node).checked_sub(1)?)
            .map(|(_, dir)| dir.join("ballast"))
    }

    /// Fills node `node`'s file system to the last block; the bytes taken.
    pub fn fill(&self, node: u8) -> Result<u64, String> {
        let path = self
            .ballast(node)
            .ok_or(format!("node {node} has no file system of its own"))?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let mut taken: u64 = 0;
        let mut chunk: u64 = 1 << 30;
        while chunk >= 4096 {
            // SAFETY: fallocate(2) on a descriptor this function owns.
            let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, taken as i64, chunk as i64) };
            if rc == 0 {
                taken += chunk;
            } else {
                let err = std::io::Error::last_os_error();
                if err.raw_os_error() != Some(libc::ENOSPC) {
                    return Err(format!("fallocate {}: {err}", path.display()));
                }
                chunk /= 2;
            }
        }
        Ok(taken)
    }

    /// Deletes node `node`'s ballast (space back).
    pub fn release(&self, node: u8) {
        if let Some(path) = self.ballast(node) {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Drop for Disks {
    fn drop(&mut self) {
        for (image, dir) in &self.mounts {
            let dir_s = dir.display().to_string();
            if run("umount", &[&dir_s]).is_err() {
                // Busy (a process still holds a file): detach it now, it
                // goes when released.
                let _ = run("umount", &["-l", &dir_s]);
            }
            if !self.keep_images {
                let _ = std::fs::remove_file(image);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs root (skipped otherwise): a file system is made, filled to
    /// ENOSPC, released, and removed.
    #[test]
    fn a_disk_fills_to_the_last_block_and_is_released() {
        if !crate::network::is_root() {
            eprintln!("skipped: not root");
            return;
        }
        let tmp = tempfile::tempdir_in("/var/tmp").unwrap();
        let node = tmp.path().join("node-1");
        let disks = Disks::create(std::slice::from_ref(&node)).unwrap();
        let taken = disks.fill(1).unwrap();
        assert!(taken > IMAGE_BYTES / 2, "took {taken}");
        let err = std::fs::write(node.join("more"), vec![1u8; 1 << 20]).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
        disks.release(1);
        std::fs::write(node.join("more"), vec![1u8; 1 << 20]).unwrap();
        drop(disks);
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
        assert!(!mounts.contains(&node.display().to_string()), "still mounted");
    }
}
